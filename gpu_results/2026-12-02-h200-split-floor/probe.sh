#!/bin/bash
# The device split's floor DEVICE_SPLIT_MIN_KEYS (4096 committed) at 1024 and 2048: short ragged batches
# (gemma2 500-4000, the small hd64 model 100-4000, the dtypes case 1000-4000) enter the device split and its
# longest-first order. Each variant against the committed tree, --with tiling tuning, 6 paired rounds.
set -u -o pipefail
REPO=$PWD
source scripts/gpu_wheels.sh >/dev/null 2>&1 || true
{ nvidia-smi --query-gpu=name,driver_version --format=csv
  python3 -c 'import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)'; date -u; } > "$OUT/env.txt" 2>&1
mk() { local d; d=$(mktemp -d); (tar --exclude=./.probe --exclude=./.whl -cf - .) | tar -xf - -C "$d"; echo "$d"; }
M1=$(mk); sed -i 's/^DEVICE_SPLIT_MIN_KEYS = 4096 /DEVICE_SPLIT_MIN_KEYS = 1024 /' "$M1/kernels/tiling.py"
M2=$(mk); sed -i 's/^DEVICE_SPLIT_MIN_KEYS = 4096 /DEVICE_SPLIT_MIN_KEYS = 2048 /' "$M2/kernels/tiling.py"
for t in M1 M2; do d=${!t}; echo "$t $(grep -h '^DEVICE_SPLIT_MIN_KEYS' "$d/kernels/tiling.py")"; done > "$OUT/variants.txt"
ab() {  # tree label suite pattern
  echo "== $2 (new) against committed: $3 --case '$4'" | tee -a "$OUT/ab.log"
  (cd "$1" && PYTHONPATH=/tmp/site:$1 timeout 150 python3 scripts/kernel_ab.py "$3" --case "$4" --base-dir "$REPO" --rounds 6 --with tiling tuning) \
    2>&1 | grep '^|\|kernel_ab\|rror' | tee -a "$OUT/ab.log"
}
ab "$M1" M1 gpu 'gemma2*'
ab "$M1" M1 gpu 'small_model*'
ab "$M1" M1 gpu 'llama3_8b_decode*'
ab "$M1" M1 gpu 'llama3_70b*'
ab "$M1" M1 gpu_peers 'decode_*'
ab "$M2" M2 gpu 'gemma2*'
ab "$M2" M2 gpu 'small_model*'
ab "$M2" M2 gpu 'llama3_8b_decode_dtypes*'
ab "$M2" M2 gpu_peers 'decode_32x4k*'
