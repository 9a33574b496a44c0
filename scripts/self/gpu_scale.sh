#!/usr/bin/env bash
# The 2-GPU scaling measurement: the same cases with --workers 1, then --workers 2, then a table
# (wall time, speed-up, worker start, dispatch wait, journal and merge per row; scripts.self.scale_table).
#   bash scripts/self/gpu_scale.sh          on a CUDA host with 2 GPUs: the oracle on each worker's GPU
#   DRY=1 bash scripts/self/gpu_scale.sh    on a CPU, as tests/harness/test_scripts.py runs it (smoke, untimed)
# Environment (all optional):
#   SUITES       case files or suite names (default cases/gpu_sweep.toml, 144 moderate cases: a sweep is
#                what sharding is for; a one-minute suite is bounded by the fixed costs; dry: smoke)
#   ARGS         more `harness run` arguments (default: three backends, timed; e.g. ARGS=--no-timing
#                to grade only; dry: --no-timing --backend tlsim)
#   WORKERS      the worker counts to run, in order, the first being the baseline (default "1 2")
#   RUN_TIMEOUT  seconds per run before SIGTERM (default 150: two runs fit in about 5 minutes)
#   WARMUP       1 (default on CUDA): first grade the cases once, untimed, over the last WORKERS count, so
#                that Triton's disk cache holds every kernel before either measured run (else the first
#                run alone compiles)
#   OUT          where results go (default gpu_out): $OUT/scale/workers<N>/ (a run folder),
#                workers<N>.log, table.md
set -uo pipefail
case "${1:-}" in -h | --help) sed -n "2,17s/^# \{0,1\}//p" "$0"; exit 0 ;; esac
OUT=${OUT:-gpu_out}
mkdir -p "$OUT/scale"
export PYTHONUNBUFFERED=1
if [ -n "${DRY:-}" ]; then
  DEVICE="--device cpu --oracle-cache off"  # no cache: the second run must not reuse the first's oracle
  SUITES=${SUITES:-smoke}
  ARGS=${ARGS:---no-timing --backend tlsim}
else
  source scripts/gpu_wheels.sh || exit 1  # wheels the image lacks
  DEVICE="--device cuda --oracle-device cuda"
  SUITES=${SUITES:-cases/gpu_sweep.toml}
  ARGS=${ARGS:---backend triton --backend cache --backend sdpa_contiguous}  # not reference: 15-40 ms a call, it ran the H200 measurement past its limit
  nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,temperature.gpu --format=csv | tee "$OUT/scale/gpus.txt"
fi
if [ "${WARMUP:-$([ -n "${DRY:-}" ] && echo 0 || echo 1)}" = 1 ]; then
  rm -rf "$OUT/scale/warmup" "$OUT/scale/warmup.journal.jsonl"
  # shellcheck disable=SC2086
  warm_workers=${WORKERS:-1 2}
  timeout -s TERM "${RUN_TIMEOUT:-150}" python3 -m harness run $SUITES $DEVICE --workers "${warm_workers##* }" \
    --out "$OUT/scale/warmup" \
    --no-progress $ARGS --no-timing >"$OUT/scale/warmup.log" 2>&1
  echo "warm-up (untimed, Triton's cache filled): exit $?"
fi
runs=()
for n in ${WORKERS:-1 2}; do
  run="$OUT/scale/workers$n"
  rm -rf "$run" "$run.journal.jsonl"
  start=$(date +%s%N)
  # shellcheck disable=SC2086  # SUITES, DEVICE and ARGS are word lists
  timeout -s TERM "${RUN_TIMEOUT:-150}" python3 -m harness run $SUITES $DEVICE --workers "$n" --out "$run" \
    --no-progress $ARGS >"$run.log" 2>&1
  code=$?
  wall=$(python3 -c "print(($(date +%s%N) - $start) / 1e9)")
  echo "--workers $n: exit $code in $wall s ($run.log)"
  tail -3 "$run.log"
  runs+=("$run" "$wall")
done
python3 -m scripts.self.scale_table "${runs[@]}" | tee "$OUT/scale/table.md"
