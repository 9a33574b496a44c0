#!/bin/bash
# The combine launched programmatically dependent on the kernel (COMBINE_PDL) against HEAD's kernel; then a
# bitwise check of its outputs, eager and under graph replay.
set -u -o pipefail
REPO=$PWD
source scripts/gpu_wheels.sh >/dev/null 2>&1 || true
{ nvidia-smi --query-gpu=name,driver_version --format=csv
  python3 -c 'import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)'; date -u; } > "$OUT/env.txt" 2>&1
mk() { local d; d=$(mktemp -d); (tar --exclude=./.probe --exclude=./.whl -cf - .) | tar -xf - -C "$d"; echo "$d"; }
# the base: the kernel as committed at c88d89f (`git show c88d89f:kernels/triton_paged.py`), copied to .probe/ for the call
BASE=$(mk); cp .probe/base_pdl/triton_paged.py "$BASE/kernels/triton_paged.py"
ab() {  # suite pattern
  echo "== PDL combine (new) against HEAD: $1 --case '$2'" | tee -a "$OUT/ab.log"
  PYTHONPATH=/tmp/site:$REPO timeout 150 python3 scripts/kernel_ab.py "$1" --case "$2" --base-dir "$BASE" --rounds 6 \
    2>&1 | grep '^|\|kernel_ab\|rror' | tee -a "$OUT/ab.log"
}
ab gpu_peers 'decode_32x4k_tp8_8q1kv'
ab gpu_peers 'decode_4x16k'
ab gpu_peers 'decode_1x128k'
ab gpu_peers 'decode_ragged*'
ab gpu_peers 'decode_32x4k/block_size=16'
ab gpu 'llama3_8b_decode*'
ab gpu 'llama3_70b*'
ab gpu 'deepseek*'
ab gpu_long 'llama3_*_decode_128k'
PYTHONPATH=/tmp/site:$REPO timeout 150 python3 gpu_results/2026-12-02-h200-combine-pdl/pdl_check.py 2>&1 | tail -40 | tee "$OUT/pdl_check.log"
