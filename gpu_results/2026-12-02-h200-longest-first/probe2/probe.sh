#!/bin/bash
# The committed longest-first order against main's kernel; then the device split's slack C under that order.
set -u -o pipefail
REPO=$PWD
source scripts/gpu_wheels.sh >/dev/null 2>&1 || true
{ nvidia-smi --query-gpu=name,driver_version --format=csv
  python3 -c 'import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)'; date -u; } > "$OUT/env.txt" 2>&1
mk() { local d; d=$(mktemp -d); (tar --exclude=./.probe --exclude=./.whl -cf - .) | tar -xf - -C "$d"; echo "$d"; }
BASE=$(mk); cp .probe/base/triton_paged.py "$BASE/kernels/triton_paged.py"
C1=$(mk); sed -i 's/^DEVICE_SPLIT_SLACK = (5, 4)$/DEVICE_SPLIT_SLACK = (1, 1)/' "$C1/kernels/tiling.py"
C2=$(mk); sed -i 's/^DEVICE_SPLIT_SLACK = (5, 4)$/DEVICE_SPLIT_SLACK = (1, 2)/' "$C2/kernels/tiling.py"
C3=$(mk); sed -i 's/^DEVICE_SPLIT_SLACK = (5, 4)$/DEVICE_SPLIT_SLACK = (1, 4)/;s/^DEVICE_SPLIT_MAX_SPLITS = 4 /DEVICE_SPLIT_MAX_SPLITS = 8 /' "$C3/kernels/tiling.py"
for t in C1 C2 C3; do d=${!t}; echo "$t $(grep -h '^DEVICE_SPLIT_SLACK\|^DEVICE_SPLIT_MAX_SPLITS' "$d/kernels/tiling.py" | tr '\n' ' ')"; done > "$OUT/variants.txt"
ab() {  # tree label base suite pattern [--with ...]
  echo "== $2 (new) against ${BASELABEL:-base}: $(basename "$4") --case '$5' ${*:6}" | tee -a "$OUT/ab.log"
  (cd "$1" && PYTHONPATH=/tmp/site:$1 timeout 200 python3 scripts/kernel_ab.py "$4" --case "$5" --base-dir "$3" --rounds 6 "${@:6}") \
    2>&1 | grep '^|\|kernel_ab' | tee -a "$OUT/ab.log"
}
BASELABEL=main
ab "$REPO" committed "$BASE" gpu 'llama3_8b_decode*'
ab "$REPO" committed "$BASE" gpu_peers 'decode_ragged*'
BASELABEL=committed
for t in C1 C2 C3; do
  ab "${!t}" "$t" "$REPO" gpu 'llama3_8b_decode*' --with tiling tuning
  ab "${!t}" "$t" "$REPO" gpu_peers 'decode_[r6]*' --with tiling tuning
done
