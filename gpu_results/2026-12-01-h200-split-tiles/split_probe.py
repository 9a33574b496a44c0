"""The KV split of a decode with few programs: how many programs the split aims for (TARGET_PROGRAMS)
and the tile config, timed side by side on every decode_split case of the GPU suites."""

import json
import sys

sys.path.insert(0, ".")
sys.path.insert(0, "scripts")
import torch
from tune_tiles import key_of, time_case

import kernels.tiling as tiling
from harness.cases.loading import load_cases
from harness.cases.packaged import resolve_case_arg
from kernels.tuning import TileConfig

cases = [
    c
    for c in load_cases([resolve_case_arg(s) for s in ("gpu_peers", "gpu", "gpu_long")], device="cuda")
    if c.wants("triton") and not c.options and key_of(c)[2] == "decode_split" and key_of(c)[0] == "half"
]
print([c.id for c in cases], flush=True)
configs = [TileConfig(16, 1, t, 4, s) for t in (32, 64, 128) for s in (3, 4)]
records = []
for target in (264, 528, 1056):
    tiling.TARGET_PROGRAMS = target
    for case in cases:
        t = tiling.choose_tiling(case.head_dim, case.group_size, 1, case.num_seqs, case.num_kv_heads, case.max_seq_len)
        times = time_case(case, configs, "cuda", 0.1)
        for config, us in times.items():
            records.append(
                {
                    "target": target,
                    "case": case.id,
                    "tile_n": config.tile_n,
                    "stages": config.num_stages,
                    "us": round(us, 2),
                }
            )
        best = min(times, key=times.get)
        print(
            f"T={target} {case.id}: splits(tile32)={t.NUM_SPLITS} "
            + " ".join(f"{c.tile_n}/{c.num_stages}:{us:.1f}" for c, us in times.items())
            + f"  best {best.tile_n}/{best.num_stages}",
            flush=True,
        )
    torch.cuda.empty_cache()
with open(sys.argv[1], "w") as file:
    json.dump(records, file, indent=0)
