#!/bin/bash
# The device split's slack C at 2 (a uniform batch of 132 programs or more stays whole) against the committed
# 5/4 (one of 132-210 programs is cut in two): that band at head_dim 128, and the ragged 8B decodes.
set -u -o pipefail
REPO=$PWD
source scripts/gpu_wheels.sh >/dev/null 2>&1 || true
{ nvidia-smi --query-gpu=name,driver_version --format=csv
  python3 -c 'import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)'; date -u; } > "$OUT/env.txt" 2>&1
mk() { local d; d=$(mktemp -d); (tar --exclude=./.probe --exclude=./.whl -cf - .) | tar -xf - -C "$d"; echo "$d"; }
C2=$(mk); cp gpu_results/2026-12-02-h200-split-band/band_cases.toml "$C2/band_cases.toml"
sed -i 's/^DEVICE_SPLIT_SLACK = (5, 4)$/DEVICE_SPLIT_SLACK = (2, 1)/' "$C2/kernels/tiling.py"
grep '^DEVICE_SPLIT_SLACK' "$C2/kernels/tiling.py" > "$OUT/variants.txt"
ab() {  # suite pattern
  echo "== C 2/1 (new) against committed C 5/4: $1 --case '$2'" | tee -a "$OUT/ab.log"
  (cd "$C2" && PYTHONPATH=/tmp/site:$C2 timeout 100 python3 scripts/kernel_ab.py "$1" --case "$2" --base-dir "$REPO" --rounds 6 --with tiling tuning) \
    2>&1 | grep '^|\|kernel_ab\|rror' | tee -a "$OUT/ab.log"
}
ab band_cases.toml '*'
ab gpu 'llama3_8b_decode_fp8'
