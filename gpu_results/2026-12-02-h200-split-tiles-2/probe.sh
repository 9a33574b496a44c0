#!/bin/bash
# Split decodes: each kernel's device time (is the combine worth folding?), a decode_split tile grid, and
# TARGET_PROGRAMS 528 against 264 (kernel_ab --with tiling tuning).
set -u -o pipefail
REPO=$PWD
SCRATCH=$(mktemp -d)  # the trees timed against this one
source scripts/gpu_wheels.sh >/dev/null 2>&1 || true
{ nvidia-smi --query-gpu=name,driver_version --format=csv
  python3 -c 'import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)'; date -u; } > "$OUT/env.txt" 2>&1
python3 gpu_results/2026-12-02-h200-split-tiles-2/kernel_times.py 2>&1 | tail -n 20 | tee "$OUT/kernel_times.txt"
python3 scripts/tune_tiles.py gpu_peers --case 'decode_*' --class decode_split --target-s 0.5 \
  --candidate 16,1,32,4,3 --candidate 16,1,32,4,4 --candidate 16,1,32,4,5 --candidate 16,1,64,4,3 \
  --candidate 16,1,64,4,4 --candidate 16,1,32,2,3 --candidate 16,1,16,2,4 --candidate 16,1,16,4,5 \
  --out "$OUT/tune_split.json" 2>&1 | tail -n 40 | tee "$OUT/tune_split.txt"
rm -rf $SCRATCH/t528; mkdir $SCRATCH/t528; (tar --exclude=./.probe --exclude=./.whl -cf - .) | tar -xf - -C $SCRATCH/t528
sed -i 's/^TARGET_PROGRAMS = 264$/TARGET_PROGRAMS = 528/' $SCRATCH/t528/kernels/tiling.py
grep -n '^TARGET_PROGRAMS' $SCRATCH/t528/kernels/tiling.py | tee "$OUT/ab.log"
for run in "gpu_peers:decode_4x16k" "gpu_peers:decode_32x4k_tp8_8q1kv" "gpu_peers:decode_1x128k" "gpu_long:*decode_128k"; do
  suite=${run%%:*} pattern=${run#*:}
  echo "== $suite --case '$pattern'" | tee -a "$OUT/ab.log"
  (cd $SCRATCH/t528 && PYTHONPATH=/tmp/site:$SCRATCH/t528 python3 scripts/kernel_ab.py $suite --case "$pattern" --base-dir "$REPO" \
      --with tiling tuning --rounds 6) 2>&1 | grep '^|' | tee -a "$OUT/ab.log"
done
