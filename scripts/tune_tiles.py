"""Measure the Triton kernel's tile configs on this GPU and print the table for kernels/tuning.py.

    python scripts/tune_tiles.py [SUITE ...] [--case PATTERN] [--class decode|verify|prefill] [--out tune.json]
    python scripts/tune_tiles.py --dry         # CPU: one tiny case, two candidates (CI)

Each case of the suites (default: gpu_peers) is timed as `harness run` times the triton backend, under
each candidate TileConfig of its key; a candidate whose output leaves the case's tolerance of the
default's is dropped. Per key the winner has the lowest geometric mean of candidate / default."""

from __future__ import annotations

import argparse
import fnmatch
import itertools
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.backends.builtin import resolve_backends
from harness.cases.loading import load_cases
from harness.cases.packaged import resolve_case_arg
from harness.cases.spec import Case
from harness.run.runner import case_inputs
from harness.timing.timer import time_call
from kernels import use_interpreter_if_no_gpu
from kernels.tiling import Tiling, choose_tiling
from kernels.tuning import TileConfig, default_config, override
from scripts.kernel_ab import timeable

# The grid per query class: (max_rows, max_tokens, tile_n, num_warps, num_stages).
GRID = {
    "decode": list(itertools.product([16], [1], [32, 64, 128, 256], [4, 8], [2, 3, 4])),  # 256: head dims <= 64
    "decode_split": list(itertools.product([16], [1], [32, 64, 128], [4, 8], [2, 3, 4])),
    "decode_split_long": list(itertools.product([16], [1], [32, 64, 128], [4, 8], [2, 3, 4])),
    "verify": list(itertools.product([32, 64], [8], [64, 128], [4, 8], [2, 3])),
    # 128 rows hold 32 tokens of a group of 4, 64 of a group of 2
    "prefill": [(64, 16, *rest) for rest in itertools.product([32, 64, 128], [4, 8], [2, 3, 4])]
    + [(128, tokens, *rest) for tokens in (32, 64) for rest in itertools.product([32, 64, 128], [4, 8], [2, 3, 4])],
}


def tiling_of(case: Case) -> Tiling:
    """The tiling choose_tiling gives the case's launch (the triton backend's hints); MLA's class may differ."""
    return choose_tiling(case.head_dim, case.group_size, max(case.q_lens), case.num_seqs, case.num_kv_heads,
                         case.max_seq_len, fp32=case.dtype == "float32", num_tokens=sum(case.q_lens),
                         kv_fp8=case.kv_dtype is not None, latent=bool(case.latent_kv))  # fmt: skip


def candidates(key: tuple[str, int, str]) -> list[TileConfig]:
    """The default config, then the grid's others (tile_n <= 64 past head dim 128, <= 128 past 64)."""
    default = default_config(*key)
    grid = [TileConfig(*point) for point in GRID[key[2]]]
    # 256-key tiles only where a K tile stays small (head_dim 64: 32 KB of bf16)
    grid = [c for c in grid if key[1] <= 64 or c.tile_n <= (64 if key[1] > 128 else 128)]
    if key[0] == "fp32":  # 16-row tiles only (see kernels.tuning.default_config)
        grid = list(dict.fromkeys(TileConfig(16, c.max_tokens, c.tile_n, c.num_warps, c.num_stages) for c in grid))
    return [default] + [c for c in grid if c != default]


def time_case(case: Case, configs: list[TileConfig], device: str, target_s: float) -> dict[TileConfig, float]:
    """Median device time (us) of the triton backend on ``case`` under each config; wrong configs left out."""
    (backend,) = resolve_backends(["triton"])
    inputs = case_inputs(case, device)
    results, expected = {}, None
    timed: dict[Tiling, TileConfig] = {}  # a launch's tiling -> the candidate timed for it
    for config in configs:
        with override(config):
            tiling = tiling_of(case)
            # the same launch as an earlier candidate's (64 tokens of a group of 4 fill 128 rows as 32 do)
            if tiling in timed:
                if timed[tiling] in results:
                    results[config] = results[timed[tiling]]
                continue
            timed[tiling] = config
            prepared = backend.prepare(case, inputs, inputs.new_out())
            try:
                got = prepared.to_packed(prepared.run()).float()
                timing = time_call(prepared.run, device, target_s=target_s)
            except Exception as error:  # a config Triton cannot compile (shared memory, registers)
                print(f"  {config}: {type(error).__name__}: {str(error).splitlines()[0][:100]}", flush=True)
                continue
        if expected is None:
            expected = got
        elif not torch.allclose(got, expected, atol=case.atol, rtol=case.rtol, equal_nan=False):
            print(f"  {config}: output differs from the default config's: dropped", flush=True)
            continue
        results[config] = timing.median_us
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suites", nargs="*", default=["gpu_peers"])
    parser.add_argument("--case", default="*", help="fnmatch pattern on case ids")
    parser.add_argument("--class", dest="q_class", choices=sorted(GRID), help="only this query class")
    parser.add_argument("--target-s", type=float, default=0.1, help="timing budget per config and case")
    parser.add_argument("--out", type=Path, help="write every measurement as JSON (rewritten after each case)")
    parser.add_argument("--candidate", action="append", default=[], metavar="ROWS,TOKENS,TILE_N,WARPS,STAGES",
                        help="time only these configs (and the default) instead of the grid; repeatable")  # fmt: skip
    parser.add_argument("--dry", action="store_true", help="one tiny smoke case, two candidates (CPU)")
    args = parser.parse_args(argv)
    use_interpreter_if_no_gpu()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    suites = ["smoke"] if args.dry else args.suites
    cases = timeable(c for c in load_cases([resolve_case_arg(s) for s in suites]) if fnmatch.fnmatch(c.id, args.case))
    if args.q_class:
        cases = [c for c in cases if tiling_of(c).TUNING_KEY[2] == args.q_class]
    if args.dry:
        cases = sorted(cases, key=lambda c: sum(c.seq_lens))[:1]
    by_key: dict[tuple, list[Case]] = defaultdict(list)
    for case in cases:
        by_key[tiling_of(case).TUNING_KEY].append(case)
    records, table = [], []
    for key, key_cases in sorted(by_key.items()):
        configs = candidates(key)[: 2 if args.dry else None]
        if args.candidate:
            chosen = [TileConfig(*map(int, text.split(","))) for text in args.candidate]
            configs = [configs[0]] + [c for c in chosen if c != configs[0]]
        print(f"{key}: {len(key_cases)} case(s) x {len(configs)} configs", flush=True)
        ratios: dict[TileConfig, list[float]] = defaultdict(list)
        for case in key_cases:
            times = time_case(case, configs, device, 0.0 if args.dry else args.target_s)
            base = times.get(configs[0])
            for config, us in times.items():
                records.append({"case": case.id, "key": list(key), "config": vars(config), "median_us": us})
                if base:
                    ratios[config].append(us / base)
            if times and base:
                best = min(times, key=times.get)
                print(f"  {case.id}: default {base:.1f} us, best {times[best]:.1f} us {best}", flush=True)
            if args.out:  # after every case, so that a tuner stopped at a time limit keeps what it measured
                args.out.write_text(json.dumps({"device": device, "records": records}, indent=1))
        # the geometric mean, over the configs timed on every case
        if gains := {c: math.prod(r) ** (1 / len(r)) for c, r in ratios.items() if len(r) == len(key_cases)}:
            winner = min(gains, key=gains.get)
            table.append((key, winner, gains[winner], len(key_cases)))
    print("\n# kernels/tuning.py TUNED (geometric-mean time against the default over the key's cases)")
    for key, winner, gain, n in table:
        print(f"    {key!r}: {winner!r},  # {gain:.3f}x the default over {n} case(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
