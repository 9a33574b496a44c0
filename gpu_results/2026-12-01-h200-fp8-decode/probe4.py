"""Occupancy check: the fp8 decode's registers (185 a thread at sm_90, 4 warps) leave room for two
programs an SM; does a register cap (Triton's maxnreg launch option) that fits more of them help?

    PYTHONPATH=. python gpu_results/2026-12-01-h200-fp8-decode/probe4.py OUT.json

Reuses probe.py's inputs and timer (its module body is run up to its measurement loop).
"""
# ruff: noqa: F821  (make, measure, SHAPES, RESULTS, torch come from probe.py's body)

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
src = (HERE / "probe.py").read_text()
sys.argv = [sys.argv[0], sys.argv[1]]  # no base module: the working tree's kernel only
exec(compile(src.split("# The final check")[0], "probe.py", "exec"))

from kernels import triton_paged  # noqa: E402
from kernels.launch_plan import clear_plans  # noqa: E402
from kernels.tuning import TileConfig  # noqa: E402

_init = triton_paged.TritonPlan.__init__
CAP = {"maxnreg": None}


def _init_with_cap(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    if CAP["maxnreg"] and getattr(self, "main", None) is not None:
        self.main.options = {**self.main.options, "maxnreg": CAP["maxnreg"]}


triton_paged.TritonPlan.__init__ = _init_with_cap
for shape in ("32x16k", "llama3_8b_decode"):
    if shape not in SHAPES:
        continue
    x = make(SHAPES[shape])
    measure(shape, x, "new", False, None, "bf16")
    ref = measure(shape, x, "new", True, None, "fp8")
    for cap, cfg in [
        (128, None),
        (160, None),
        (168, None),
        (128, TileConfig(16, 1, 64, 4, 3)),
        (96, TileConfig(16, 1, 64, 4, 3)),
    ]:
        CAP["maxnreg"] = cap
        clear_plans()  # the plan key does not hold the cap: build each plan afresh
        tiles = "" if cfg is None else f" t{cfg.tile_n}"
        measure(shape, x, "new", True, cfg, f"fp8 maxnreg {cap}{tiles}", ref)
        CAP["maxnreg"] = None
        clear_plans()
    del x
    torch.cuda.empty_cache()
print(json.dumps([(r["shape"], r["label"], round(r.get("us", 0), 1)) for r in RESULTS]))
