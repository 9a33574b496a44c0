#!/bin/bash
# The decode tiles of the misses: the head_dim 64 key over both hd64 decodes, then per-case data for MHA 40
# and 256 x 2k (the head_dim 128 decode key's cases, each alone).
set -u -o pipefail
source scripts/gpu_wheels.sh >/dev/null 2>&1 || true
{ nvidia-smi --query-gpu=name,driver_version --format=csv
  python3 -c 'import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)'; date -u; } > "$OUT/env.txt" 2>&1
python3 -m pytest -q -p no:cacheprovider tests/test_timing_and_scaling.py -k "budget" 2>&1 | tail -15 | tee "$OUT/budget_test.log"
for spec in "hd64:*hd64*" "mha40:decode_16x2k_mha40" "256x2k:decode_256x2k"; do
  name=${spec%%:*}; pattern=${spec#*:}
  echo "== tune_tiles gpu_peers gpu --case '$pattern' --class decode" | tee -a "$OUT/tune.log"
  timeout 150 python3 scripts/tune_tiles.py gpu_peers gpu --case "$pattern" --class decode --out "$OUT/tune_$name.json" 2>&1 | tee -a "$OUT/tune.log"
done
