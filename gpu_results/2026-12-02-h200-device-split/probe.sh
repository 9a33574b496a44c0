#!/bin/bash
# The device split (overlay .probe/dsplit) against this tree (main), kernel_ab side by side, then GPU tests.
set -u -o pipefail
REPO=$PWD
SCRATCH=$(mktemp -d)  # the trees timed against this one
source scripts/gpu_wheels.sh >/dev/null 2>&1 || true
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c 'import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)'; date -u; } > "$OUT/env.txt" 2>&1
variant() {  # NAME SLACK_NUM SLACK_DEN MAX_SPLITS
  rm -rf $SCRATCH/$1; mkdir $SCRATCH/$1; (cd $REPO && tar --exclude=./.probe --exclude=./.whl -cf - .) | tar -xf - -C $SCRATCH/$1
  cp -r $REPO/.probe/dsplit/. $SCRATCH/$1/
  sed -i -e "s/^DEVICE_SPLIT = False$/DEVICE_SPLIT = True/" -e "s/^DEVICE_SPLIT_SLACK = (5, 4)$/DEVICE_SPLIT_SLACK = ($2, $3)/" \
      -e "s/^DEVICE_SPLIT_MAX_SPLITS = 4 /DEVICE_SPLIT_MAX_SPLITS = $4 /" $SCRATCH/$1/kernels/tiling.py
  echo "== variant $1:" $(grep -E '^DEVICE_SPLIT(_SLACK|_MAX_SPLITS)? =' $SCRATCH/$1/kernels/tiling.py | cut -c1-40) | tee -a "$OUT/ab.log"
}
ab() {  # NAME SUITE PATTERN
  echo "== $1 $2 --case '$3'" | tee -a "$OUT/ab.log"
  (cd $SCRATCH/$1 && PYTHONPATH=/tmp/site:$SCRATCH/$1 python3 scripts/kernel_ab.py $2 --case "$3" --base-dir "$REPO" --with tiling tuning --rounds 6 \
      --out "$OUT/$1_$2.json") 2>&1 | grep -v '^\s*$' | tail -n 40 | tee -a "$OUT/ab.log"
}
variant A 5 4 4
variant B 17 16 8
ab A gpu 'llama3_8b_decode*'
ab B gpu 'llama3_8b_decode*'
ab A gpu_peers 'decode_*'
ab A gpu_long '*decode_128k'
(cd $SCRATCH/A && PYTHONPATH=/tmp/site:$SCRATCH/A python3 -m pytest -q -n 4 -p no:cacheprovider -m gpu tests/test_tlsim_predicts_triton.py tests/test_kernel_sync_free.py \
    tests/test_backends_match_oracle.py 2>&1 | tail -n 40) > "$OUT/pytest.log"
tail -n 3 "$OUT/pytest.log"
