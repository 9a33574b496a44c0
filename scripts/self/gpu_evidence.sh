#!/usr/bin/env bash
# One call on a 2-GPU host: the scaling, noise and kernel evidence in two lanes, one per GPU, so that
# a lane's timings never share a GPU (they share the host's CPUs: no FlexAttention compiles here,
# whose compile workers load a 32-core host far past its cores).
#   lane 0 (GPU 0): scripts/self/noise_check.py --gpu (reruns and a planted 5% slowdown), then the peer
#                   run (cases/gpu_peers.toml cases/gpu_long.toml, five backends) for the targets
#   lane 1 (GPU 1): the CUDA-only tests (pytest -m gpu), the GPU variants timed (triton, cache, sdpa_contiguous), scripts/self/host_overhead.py,
#                   five prefill tile candidates (scripts/tune_tiles.py), scripts/self/measure_tlsim_closeness.py,
#                   every variant through the four built-ins graded
#   before the lanes, with both GPUs idle (SCALE=0 skips it): scripts/self/gpu_scale.sh over
#                   SCALE_SUITES (cases/gpu.toml cases/gpu_peers.toml), SCALE_TIMEOUT s a run (120)
#   OUT=DIR bash scripts/self/gpu_evidence.sh    (default gpu_out); LIMIT0 / LIMIT1: seconds per lane (540)
# Every run folder keeps its journal: a lane stopped by its limit is finalized from it
# (`harness run --resume RUN --finalize`), and says so in its meta.json.
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source scripts/gpu_wheels.sh || exit 1
export HARNESS_COMMIT=${HARNESS_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
{
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  date -u
  echo "commit $HARNESS_COMMIT"
} | tee "$OUT/versions.txt"
run() { python3 -m harness run --device cuda --oracle-device cuda --no-progress "$@"; }
left() { echo $(( $1 - ($(date +%s) - START) )); }
if [ "${SCALE:-1}" = 1 ]; then  # first, while both GPUs are idle: one worker against two
  WARMUP=1 RUN_TIMEOUT=${SCALE_TIMEOUT:-120} SUITES=${SCALE_SUITES:-"cases/gpu.toml cases/gpu_peers.toml"} \
    OUT="$OUT" bash scripts/self/gpu_scale.sh >"$OUT/scale.log" 2>&1
  for n in 1 2; do
    d=$OUT/scale/workers$n
    [ -f "$d/meta.json" ] || python3 -m harness run --resume "$d" --finalize >>"$OUT/scale.log" 2>&1
    rm -f "$d"/*.csv "$d"/report.html
  done
  rm -rf "$OUT/scale/warmup"
fi
START=$(date +%s)
lane0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout -s TERM "$(left "${LIMIT0:-540}")" python3 scripts/self/noise_check.py --gpu --out "$OUT/noise" >"$OUT/noise.log" 2>&1
  echo "noise_check exit $?" >>"$OUT/noise.log"
  timeout -s TERM "$(left "${LIMIT0:-540}")" bash -c "$(declare -f run); run cases/gpu_peers.toml cases/gpu_long.toml \
    --backend triton --backend cache --backend sdpa_contiguous --backend varlen_flash --backend flex_paged \
    --out $OUT/peers" >"$OUT/peers.log" 2>&1
}
lane1() {
  export CUDA_VISIBLE_DEVICES=1
  timeout -s TERM 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ --ignore=tests/harness/test_peer_flex_paged.py \
    >"$OUT/gpu_tests.log" 2>&1  # the CUDA-only tests (FlexAttention's compile last: its workers load the host)
  timeout -s TERM "$(left "${LIMIT1:-540}")" bash -c "$(declare -f run); run cases/variants.toml --tag gpu \
    --backend triton --backend cache --backend sdpa_contiguous --out $OUT/variants_timed" >"$OUT/variants_timed.log" 2>&1
  timeout -s TERM 60 python3 scripts/self/host_overhead.py >"$OUT/host_overhead.txt" 2>&1
  timeout -s TERM 100 python3 scripts/tune_tiles.py --class prefill --target-s 0.2 --out "$OUT/tune_prefill.json" \
    --candidate 128,32,64,8,2 --candidate 128,32,128,8,2 --candidate 128,32,128,8,3 --candidate 128,32,64,8,3 \
    --candidate 64,16,128,4,3 >"$OUT/tune_prefill.log" 2>&1
  timeout -s TERM "$(left "${LIMIT1:-540}")" python3 scripts/self/measure_tlsim_closeness.py >"$OUT/tlsim_closeness.txt" 2>&1
  timeout -s TERM "$(left "${LIMIT1:-540}")" bash -c "$(declare -f run); run cases/variants.toml --no-timing \
    --backend reference --backend tlsim --backend triton --backend cache --out $OUT/variants_graded" >"$OUT/variants_graded.log" 2>&1
  timeout -s TERM "$(left "${LIMIT1:-540}")" python3 -m pytest -q -p no:cacheprovider -m gpu tests/harness/test_peer_flex_paged.py \
    >>"$OUT/gpu_tests.log" 2>&1
}
lane0 & lane1 & wait
for d in peers variants_timed variants_graded; do
  [ -d "$OUT/$d" ] || [ -f "$OUT/$d.journal.jsonl" ] || continue
  [ -f "$OUT/$d/meta.json" ] || python3 -m harness run --resume "$OUT/$d" --finalize >>"$OUT/$d.log" 2>&1
  rm -f "$OUT/$d"/*.csv "$OUT/$d"/report.html
done
[ -d "$OUT/peers" ] && python3 scripts/kernel_targets.py "$OUT/peers" >"$OUT/targets.md" 2>&1
tail -4 "$OUT"/*.log "$OUT/host_overhead.txt" "$OUT/targets.md" 2>/dev/null
