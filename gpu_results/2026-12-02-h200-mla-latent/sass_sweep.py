"""The MLA decode builds compiled for sm_90 on a machine without a GPU (sass_loop.py's compile): registers,
stack, shared memory, and per tile loop the instructions a warp a tile, its HGMMA shapes and its local
loads / stores (spills inside the loop).

    PYTHONPATH=/path/to/triton-3.6:. python gpu_results/2026-12-02-h200-mla-latent/sass_sweep.py

bf16 q and cache, group 128 on one KV head, K 576 = 512 + 64, V 512, blocks of 64, query_start_loc given.
"""

from __future__ import annotations

import collections
import importlib.util
import pathlib
import re

HERE = pathlib.Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("sass_loop", HERE.parent / "2026-12-01-h200-fp8-round2" / "sass_loop.py")
sl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sl)

MLA = dict(GROUP_SIZE=128, BLOCK_Q=1, HEAD_DIM=576, DIM_MAIN=512, DIM_TAIL=64, HEAD_DIM_V=512, HEAD_DIM_V_PADDED=512,
           BLOCK_SIZE=64, KV_FP8=False, FP16_DOTS=False, V_PAIRS=False)  # fmt: skip
# name, (heads a program, V parts, shared K / V), [(tile_n, warps, stages), ...]
BUILDS = [
    ("64 heads, V in 2 parts (base)", (64, 2, False), [(32, 8, 3), (32, 8, 2), (64, 8, 2)]),
    ("64 heads, V whole", (64, 1, False), [(16, 8, 1), (16, 8, 2), (16, 8, 3), (32, 8, 2)]),
    (
        "64 heads, V whole, latent",
        (64, 1, True),
        [(16, 8, 2), (16, 8, 3), (16, 8, 4), (32, 8, 1), (32, 8, 2), (32, 8, 3), (64, 8, 1), (64, 8, 2)],
    ),
    ("128 heads, V in 2 parts", (128, 2, False), [(16, 8, 2), (16, 8, 3), (32, 8, 2)]),
]


def main() -> None:
    print("| build | tile_n, warps, stages | registers | stack | shared KB | loop: instructions, HGMMA, LDL+STL |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, (heads, parts, shared), configs in BUILDS:
        for tile_n, warps, stages in configs:
            const = dict(MLA, HEADS_PER_PROGRAM=heads, HEAD_TILES=128 // heads, BLOCK_M=heads, V_PARTS=parts,
                         V_PART_DIM=512 // parts, SHARED_KV=shared)  # fmt: skip
            try:
                c = sl.compile_kernel("kernels.triton_paged", "bf16", "bf16", tile_n, warps, stages, const)
            except Exception as e:  # a build that does not compile is a row too
                print(f"| {name} | {tile_n}, {warps}, {stages} | does not compile: {str(e)[:80]} |")
                continue
            sass, usage = sl.sass_of(c.asm["cubin"])
            reg = re.search(r"REG:(\d+)", usage).group(1)
            stack = re.search(r"STACK:(\d+)", usage).group(1)
            loops = [body for _, body in sl.loops(sass) if len(body) > 100]
            parts_txt = []
            for body in loops:
                hg = collections.Counter(op for op in body if op.startswith("HGMMA"))
                ls = sum(op.startswith(("LDL", "STL")) for op in body)
                parts_txt.append(f"{len(body)}, " + " ".join(f"{n}x {op[6:].split('.')[0]}" for op, n in hg.items())
                                 + f", {ls}")  # fmt: skip
            print(f"| {name} | {tile_n}, {warps}, {stages} | {reg} | {stack} | {c.metadata.shared / 1024:.0f} | "
                  + " / ".join(parts_txt) + " |")  # fmt: skip


if __name__ == "__main__":
    main()
