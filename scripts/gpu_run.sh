#!/usr/bin/env bash
# One call on a CUDA machine: check and time, leaving the results in $OUT. `nox -s gpu` runs this.
#   bash scripts/gpu_run.sh [all|tests|suites|closeness] [harness run arguments...]   (default: all)
#   versions.txt   GPU, driver, clocks, python/torch/triton versions, date, commit
#   flashinfer_warmup.txt  FlashInfer's kernels for SUITES built before anything is timed (scripts/flashinfer_warmup.py)
#   tests.log      (tests, all) the GPU tests natively (Triton compiled): `pytest -m gpu` over the
#                  whole tree; the rest of the suite is CPU logic (or the interpreted kernel, which
#                  fails without TRITON_INTERPRET=1 set) that CI runs
#   run.log, run/  (suites, all) one harness run of SUITES (default: the smoke, peer, GPU and
#                  128k-token suites, every backend), each line stamped with the epoch second it
#                  was printed; extra arguments go to `harness run` (e.g. --backend triton)
#   phases.txt     where the time went: tests, start-up, each suite, the write (printed too);
#                  meta.json's scale.phase_s splits the rows' time (inputs, oracle, grading, timing)
#   kernel_targets.txt  (suites, all) scripts/kernel_targets.py's score of the run (the targets' lines)
#   closeness.txt  (closeness only) tlsim vs the Triton kernel on every kernel test case
# The whole call stays within BUDGET_S (default 570 s): the run gets what the tests left, less
# WRITE_S (20 s) for the report, and a SIGTERM at that limit keeps every finished row in
# $OUT/run.journal.jsonl, from which the run folder is then written (`harness run --resume $OUT/run
# --finalize`: meta.json marks it incomplete and names the (case, backend) pairs that never ran).
# Wheels of packages the image lacks (pydantic and its three helpers) travel in .whl/ (README: "On a GPU").
set -uo pipefail
case "${1:-}" in -h | --help) sed -n "2,19s/^# \{0,1\}//p" "$0"; exit 0 ;; esac
MODE=${1:-all}
OUT=${OUT:-gpu_out}
SUITES=${SUITES:-cases/smoke.toml cases/gpu_peers.toml cases/gpu.toml cases/gpu_long.toml}
BUDGET_S=${BUDGET_S:-570}
START=$(date +%s)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source scripts/gpu_wheels.sh || exit 1
stamp() { python3 -u -c 'import sys, time
for line in sys.stdin:
    sys.stdout.write(f"{time.time():.3f} {line}")'; }
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  date -u
  echo "commit ${HARNESS_COMMIT:-unknown}"
  echo "mode $MODE; suites $SUITES; budget ${BUDGET_S}s"
} | tee "$OUT/versions.txt"
echo "start $START" >"$OUT/phases.raw"
status=0
# FlashInfer's kernels compile on first use: build the ones these suites need now, not inside a row's time limit
# (FLASHINFER_WORKSPACE_BASE keeps them for the run's workers; without FlashInfer it prints one line)
# shellcheck disable=SC2086
python3 scripts/flashinfer_warmup.py $SUITES 2>&1 | tee "$OUT/flashinfer_warmup.txt" | tail -20
if [ "$MODE" = all ] || [ "$MODE" = tests ]; then
  echo "tests_start $(date +%s.%N)" >>"$OUT/phases.raw"
  # four workers share the GPU where pytest-xdist is installed (on an H200 the GPU tests take
  # about half the time of one worker)
  WORKERS=$(python3 -c 'import xdist' 2>/dev/null && echo "-n 4")
  # shellcheck disable=SC2086
  python3 -m pytest -q -p no:cacheprovider $WORKERS -m gpu tests 2>&1 | tee "$OUT/tests.log" | tail -12
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  echo "tests_end $(date +%s.%N)" >>"$OUT/phases.raw"
fi
if [ "$MODE" = closeness ]; then
  python3 scripts/self/measure_tlsim_closeness.py 2>&1 | tee "$OUT/closeness.txt" | tail -3
fi
if [ "$MODE" = all ] || [ "$MODE" = suites ]; then
  LEFT=$((BUDGET_S - ${WRITE_S:-20} - ($(date +%s) - START)))
  echo "run_start $(date +%s.%N)" >>"$OUT/phases.raw"
  # shellcheck disable=SC2086
  timeout -s TERM "$LEFT" python3 -m harness run $SUITES --device cuda --oracle-device cuda --out "$OUT/run" \
    --no-progress "${@:2}" 2>&1 | stamp | tee "$OUT/run.log" | cut -d' ' -f2- | tail -70
  code=${PIPESTATUS[0]}
  echo "run_end $(date +%s.%N) $code" >>"$OUT/phases.raw"
  [ "$code" -eq 0 ] || status=$code
  if [ "$code" -eq 124 ] && [ -f "$OUT/run.journal.jsonl" ]; then  # the report of the rows that finished
    echo "stopped at the ${BUDGET_S} s budget: writing the finished rows' report (meta.json lists the rest)"
    python3 -m harness run --resume "$OUT/run" --finalize --no-progress 2>&1 | grep -v '^\[' | tail -12
  fi
fi
python3 scripts/self/gpu_phases.py "$OUT" | tee "$OUT/phases.txt"
if [ -f "$OUT/run/meta.json" ]; then
  python3 scripts/kernel_targets.py "$OUT/run" >"$OUT/kernel_targets.txt" 2>&1 && grep '^## ' "$OUT/kernel_targets.txt"
fi
exit $status
