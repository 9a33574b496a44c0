#!/bin/bash
# k_scale folded into q's power of two (overlay .probe/fp8a1) against this tree, side by side.
set -u -o pipefail
REPO=$PWD
SCRATCH=$(mktemp -d)  # the trees timed against this one
source scripts/gpu_wheels.sh >/dev/null 2>&1 || true
{ nvidia-smi --query-gpu=name,driver_version --format=csv
  python3 -c 'import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)'; date -u; } > "$OUT/env.txt" 2>&1
rm -rf $SCRATCH/a1; mkdir $SCRATCH/a1; (tar --exclude=./.probe --exclude=./.whl -cf - .) | tar -xf - -C $SCRATCH/a1
cp -r .probe/fp8a1/. $SCRATCH/a1/
for run in "gpu:llama3_8b_decode_fp8" "$REPO/gpu_results/2026-12-02-h200-fp8-scale-fold/fp8_cases.toml:*"; do
  suite=${run%%:*} pattern=${run#*:}
  echo "== $(basename $suite) --case '$pattern'" | tee -a "$OUT/ab.log"
  (cd $SCRATCH/a1 && PYTHONPATH=/tmp/site:$SCRATCH/a1 python3 scripts/kernel_ab.py $suite --case "$pattern" --base-dir "$REPO" --rounds 8) \
      2>&1 | grep '^|' | tee -a "$OUT/ab.log"
done
(cd $SCRATCH/a1 && PYTHONPATH=/tmp/site:$SCRATCH/a1 python3 -m pytest -q -n 4 -p no:cacheprovider -m gpu tests/test_variants_fp8.py \
    tests/test_tlsim_predicts_triton.py -k "fp8 or device_split" 2>&1 | tail -n 5) > "$OUT/pytest.log"
cat "$OUT/pytest.log"
