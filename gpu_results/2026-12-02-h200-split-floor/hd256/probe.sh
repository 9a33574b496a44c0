#!/bin/bash
# The device split's floor at head_dim 256 halved (2048 keys: device_split_min_keys) against the committed
# tiling (4096 for every head dim): gemma2 and five head_dim 256 batches of bounds 3000-4096.
set -u -o pipefail
REPO=$PWD
source scripts/gpu_wheels.sh >/dev/null 2>&1 || true
{ nvidia-smi --query-gpu=name,driver_version --format=csv
  python3 -c 'import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)'; date -u; } > "$OUT/env.txt" 2>&1
mk() { local d; d=$(mktemp -d); (tar --exclude=./.probe --exclude=./.whl -cf - .) | tar -xf - -C "$d"; echo "$d"; }
# the base: the tiling as committed at e74277a (`git show e74277a:kernels/tiling.py`), copied to .probe/ for the call
BASE=$(mk); cp .probe/base_tiling.py "$BASE/kernels/tiling.py"
ab() {  # suite pattern
  echo "== hd256 floor 2048 (new) against committed: $1 --case '$2'" | tee -a "$OUT/ab.log"
  PYTHONPATH=/tmp/site:$REPO timeout 200 python3 scripts/kernel_ab.py "$1" --case "$2" --base-dir "$BASE" --rounds 6 --with tiling tuning \
    2>&1 | grep '^|\|kernel_ab\|rror' | tee -a "$OUT/ab.log"
}
ab gpu 'gemma2*'
ab gpu_results/2026-12-02-h200-split-floor/hd256/hd256_cases.toml '*'
ab gpu 'llama3_8b_decode_fp8'
