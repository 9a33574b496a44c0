"""Probe: would packing P adjacent KV heads into one program (a block-diagonal q over P * head_dim dims)
pay on the decode misses? The packed launch reads the same bytes as a case of num_kv_heads / P heads of
P * head_dim dims, so each real case is timed beside its packed twin (the kernel) and SDPA on the real one."""

import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from harness.backends.builtin import resolve_backends
from harness.cases.loading import load_cases
from harness.run.runner import case_inputs
from harness.timing.timer import time_call

device = "cuda" if torch.cuda.is_available() else "cpu"
rounds = int(os.environ.get("ROUNDS", "7"))
cases = {c.id: c for c in load_cases([Path(__file__).with_name("pack_cases.toml")])}
(tri,) = resolve_backends(["triton"])
(sdpa,) = resolve_backends(["sdpa_contiguous"])
groups = {"hd64": ["hd64_real", "hd64_pack2", "hd64_pack4"], "mha40": ["mha40_real", "mha40_pack2"]}
for label, ids in groups.items():
    runs = {}
    for cid in ids:
        case = cases[cid]
        inputs = case_inputs(case, device)
        p = tri.prepare(case, inputs, inputs.new_out())
        p.run()
        runs[cid] = p.run
        if cid.endswith("real"):
            s = sdpa.prepare(case, inputs, inputs.new_out())
            s.run()
            runs["sdpa"] = s.run
    if device == "cpu":
        print(label, "prepared", list(runs))
        continue
    times = {n: [] for n in runs}
    for _ in range(rounds):
        for n, fn in runs.items():
            times[n].append(time_call(fn, device, target_s=0.05, graph=True).median_us)
    base = statistics.median(times["sdpa"])
    print(f"\n== {label}: SDPA on the real case {base:.1f} us", flush=True)
    for n, ts in times.items():
        r = sorted(t / b for t, b in zip(ts, times["sdpa"], strict=True))
        print(
            f"  {n:12s} {statistics.median(ts):8.1f} us  x SDPA {statistics.median(ts) / base:.3f} [{r[0]:.3f}, {r[-1]:.3f}]",
            flush=True,
        )
