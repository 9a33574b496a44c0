#!/usr/bin/env bash
# One call on a CUDA machine: check and time, leaving the results in $OUT.
#   bash scripts/gpu_run.sh [suites|tests|all]     (default: all)
#   versions.txt   GPU, driver, clocks, python/torch/triton versions, date, commit
#   tests.log      (tests, all) the whole pytest suite natively (Triton compiled)
#   closeness.txt  (tests, all) tlsim vs the Triton kernel on every kernel test case
#   run.log, run/  (suites, all) the harness run of the peer, GPU and 128k suites (SUITES=...), timed;
#                  extra arguments go to `harness run` (e.g. --backend triton)
#                  (parquet, csv, meta.json, report.html)
# Wheels of packages the image lacks (pydantic and its three helpers) travel in .whl/
# (README: "Running on a lent GPU").
set -uo pipefail
MODE=${1:-all}
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source scripts/gpu_wheels.sh || exit 1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  date -u
  echo "commit ${HARNESS_COMMIT:-unknown}"
} | tee "$OUT/versions.txt"
if [ "$MODE" != suites ]; then
  python3 -m pytest -q -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" | tail -8
  python3 scripts/measure_tlsim_closeness.py 2>&1 | tee "$OUT/closeness.txt" | tail -3
fi
if [ "$MODE" != tests ]; then
  # SIGTERM at RUN_TIMEOUT keeps every finished row in $OUT/run.journal.jsonl (resume it with --resume).
  timeout -s TERM "${RUN_TIMEOUT:-540}" python3 -m harness run ${SUITES:-cases/gpu_peers.toml cases/gpu.toml cases/gpu_long.toml} \
    --device cuda --oracle-device cuda --out "$OUT/run" --no-progress "${@:2}" 2>&1 | tee "$OUT/run.log" | tail -70
fi
