source scripts/gpu_wheels.sh
python3 -m harness run gpu_results/2026-12-01-h200-split-tiles/check/split_cases.toml --device cuda --oracle-device cuda --backend triton --backend cache --backend sdpa_contiguous --backend varlen_flash --out $OUT/run --no-progress > $OUT/run.log 2>&1
echo run rc=$?
tail -12 $OUT/run.log
python3 - <<'PY' | tee $OUT/ratios.txt
import os, pandas as pd
f = pd.read_parquet(os.environ["OUT"] + "/run/results.parquet")
p = f.pivot(index="case", columns="backend", values="latency_us")
peers = [c for c in ("sdpa_contiguous", "varlen_flash") if c in p]
p["best_peer"] = p[peers].min(axis=1)
p["triton/best"] = p["triton"] / p["best_peer"]
pct = f[f.backend == "triton"].set_index("case")["pct_of_ceiling"]
p["triton_pct_ceiling"] = pct
print(p.round(3).to_string())
PY
python3 scripts/tune_tiles.py gpu --class decode --case 'gemma2*' --out $OUT/tune_hd256.json 2>&1 | tail -8 | tee $OUT/tune_hd256.txt
