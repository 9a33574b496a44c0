"""Host overhead of the Triton kernel's call, launch plans off and on, against SDPA's eager call.

    python scripts/self/host_overhead.py                 # on a GPU: decode_32x4k's shape
    python scripts/self/host_overhead.py --shape decode_4x16k   # a decode whose KV is split: two launches a call
    python scripts/self/host_overhead.py --profile       # and cProfile's top 15 of 300 calls, plans off and on
    python scripts/self/host_overhead.py --dry           # a tiny case on the CPU (the interpreter; tests/harness/test_scripts.py)

Targets: host time (plans on) <= 20 us, eager within 1.1x of SDPA's."""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import timeit
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import kernels
from harness.cases.inputs import make_inputs
from harness.timing.timer import time_call, time_wall
from kernels import launch_plan

DECODE_32X4K = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=16, seq_lens=[4096] * 32,
                    q_lens=[1] * 32, dtype="bfloat16", layout="shuffled")  # fmt: skip
SHAPES = {  # --shape: decode_32x4k's (one launch), or a decode whose KV is split (the kernel, then the combine)
    "decode_32x4k": DECODE_32X4K,
    "decode_4x16k": {**DECODE_32X4K, "seq_lens": [16384] * 4, "q_lens": [1] * 4},
}
TINY = dict(num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=4, seq_lens=[8, 8], q_lens=[1, 1],
            dtype="float32", layout="shuffled")  # fmt: skip


def calls(inputs) -> dict[str, callable]:
    """The three ways of calling the kernel, each a zero-argument closure (setup outside)."""
    q, k_cache, v_cache, block_table, seq_lens, query_start_loc = inputs.args()
    out = inputs.new_out()
    longest = max(inputs.seq_lens.tolist())  # read here, not in the timed call (a device sync)
    fn = kernels.paged_attention_triton
    return {
        "default": lambda: fn(q, k_cache, v_cache, block_table, seq_lens, query_start_loc),
        "no_offsets": lambda: fn(q, k_cache, v_cache, block_table, seq_lens),
        "hints_out": lambda: fn(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, out=out, max_q_len=1,
                                max_seq_len=longest),
    }  # fmt: skip


def sdpa_call(inputs):
    """SDPA on contiguous copies: q [num_seqs, num_q_heads, 1, head_dim], K/V [num_seqs, num_kv_heads, keys, head_dim]."""
    q = inputs.q[:, :, None, :].contiguous()
    k = torch.stack(inputs.keys).permute(0, 2, 1, 3).contiguous().to(q.device)
    v = torch.stack(inputs.values).permute(0, 2, 1, 3).contiguous().to(q.device)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return lambda: sdpa(q, k, v, enable_gqa=True)


LOOPS = 7  # host loops per measurement; the fastest is kept


def host_us(fn, n: int, device: str, loops: int) -> float:
    """Host us a call, queue not drained: the fastest of ``loops`` loops of n back-to-back calls (timeit's)."""
    sync = torch.cuda.synchronize if device == "cuda" else lambda: None
    fn()
    best = min(timeit.repeat(fn, setup=sync, number=n, repeat=loops))
    sync()
    return best / n * 1e6


def measure(inputs, device: str, n: int, reps: dict, loops: int) -> str:
    """A markdown table, a row a call kind: host and eager with the plans off and on, device time, SDPA's."""
    sdpa = sdpa_call(inputs)
    sdpa_host, sdpa_eager = host_us(sdpa, n, device, loops), time_wall(sdpa, device, **reps).median_us
    lines = [
        "| call | host us, plans off | host us, plans on | eager us, off | eager us, on | device us | "
        "SDPA host us | SDPA eager us | eager on / SDPA eager |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, fn in calls(inputs).items():
        host, eager = {}, {}  # by plans on
        for on in (False, True):
            with launch_plan.plans_enabled(on):
                host[on], eager[on] = host_us(fn, n, device, loops), time_wall(fn, device, **reps).median_us
        lines.append(
            f"| {name} | {host[False]:.1f} | {host[True]:.1f} | {eager[False]:.1f} | {eager[True]:.1f} | "
            f"{time_call(fn, device, **reps).median_us:.1f} | {sdpa_host:.1f} | {sdpa_eager:.1f} | "
            f"{eager[True] / sdpa_eager:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry", action="store_true", help="a tiny case on the CPU, few calls (the test suite's run)")
    parser.add_argument("--calls", type=int, default=300, help="back-to-back calls of the host measurement")
    parser.add_argument("--profile", action="store_true", help="also print cProfile's top 15, plans off and on")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="decode_32x4k",
                        help="the GPU run's shape: decode_4x16k takes the split path (two launches); --dry keeps its tiny one")  # fmt: skip
    args = parser.parse_args(argv)
    kernels.use_interpreter_if_no_gpu()
    device = "cpu" if args.dry or not torch.cuda.is_available() else "cuda"
    if device == "cpu" and not args.dry:
        parser.error("no CUDA device: pass --dry for the CPU run")
    n = 3 if args.dry else args.calls
    reps = {"min_reps": 2, "max_reps": 2} if args.dry else {}
    spec = TINY if args.dry else SHAPES[args.shape]
    inputs = make_inputs(**spec, device=device)
    from kernels import triton_paged  # after the interpreter choice

    lengths = f"{len(spec['seq_lens'])} x {spec['seq_lens'][0]}"
    shape = "tiny (dry)" if args.dry else f"{args.shape}: bf16, 32/8 heads, head_dim 128, block 16, {lengths}"
    print(f"# host overhead of paged_attention_triton, {shape}, on {device}")
    print(measure(inputs, device, n, reps, loops=1 if args.dry else LOOPS))  # dry: each interpreted call ~0.1 s
    plans = triton_paged.PLANS
    compiled = sum(r.plan.main.compiled is not None for r in plans.plans() if not r.plan.noop)
    launches = launch_plan.fast_launch_status() if device == "cuda" else "JIT entry (the interpreter)"
    print(f"\nplans (the last 'on' stretch): {plans.hits} hits, {plans.misses} misses, {len(plans)} kept, "
          f"{compiled} holding a compiled kernel; hits launch through: {launches}")  # fmt: skip
    if args.profile:
        fn = calls(inputs)["default"]
        for flag in (False, True):
            print(f"\n## cProfile, default call, plans {'on' if flag else 'off'}, {n} calls\n")
            with launch_plan.plans_enabled(flag):
                fn()  # the first call's work stays out of the profile
                with cProfile.Profile() as profiler:
                    for _ in range(n):
                        fn()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(15)  # the top 15 by own time
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
