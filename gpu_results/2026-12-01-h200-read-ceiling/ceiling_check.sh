source scripts/gpu_wheels.sh
python3 gpu_results/2026-12-01-h200-read-ceiling/read_probe.py > $OUT/read_ceiling.txt 2>&1
python3 -m harness run gpu_results/2026-12-01-h200-read-ceiling/ceiling_cases.toml --device cuda --oracle-device cuda --backend sdpa_contiguous --backend triton --backend cache --backend varlen_flash --out $OUT/run --no-progress > $OUT/run.log 2>&1
echo rc=$?
python3 - <<'PY' | tee $OUT/pct.txt
import pandas as pd, json
f = pd.read_parquet("$OUT/run/results.parquet")
m = json.load(open("$OUT/run/meta.json"))
print("read_gbps", round(m["ceilings"]["read_gbps"], 1), "copy_gbps", round(m["ceilings"]["copy_gbps"], 1))
print(f[["case", "backend", "status", "latency_us", "gbps", "pct_of_ceiling"]].round(1).to_string())
PY
cp $OUT/run/meta.json $OUT/
