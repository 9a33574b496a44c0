#!/usr/bin/env bash
# One call on a CUDA machine checks and times everything, and leaves the results in $OUT:
#   versions.txt   GPU, driver, python/torch/triton versions, date, commit
#   closeness.txt  tlsim vs the Triton kernel on every kernel test case
#   nox_gpu.log    `nox -s gpu`: the whole test suite natively (Triton compiled), then smoke + gpu + gpu_long suites, timed
#   run/           the harness run folder of that nox session (parquet, csv, meta, html)
# Wheels of packages the image lacks (pydantic, nox) travel in .whl/ (see README).
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  date -u
  echo "commit ${HARNESS_COMMIT:-unknown}"
} | tee "$OUT/versions.txt"
python3 scripts/measure_tlsim_closeness.py 2>&1 | tee "$OUT/closeness.txt" | tail -3
python3 -m nox -s gpu -- --out "$OUT/run" --no-progress 2>&1 | tee "$OUT/nox_gpu.log" | tail -45
