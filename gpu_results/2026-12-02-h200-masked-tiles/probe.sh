#!/bin/bash
# The masked-tile trim (overlay .probe/prefill) and it plus longest-first tile order (.probe/prefill_lpt)
# against this tree (main), kernel_ab side by side; then the GPU tests of the kept candidate.
set -u -o pipefail
REPO=$PWD
SCRATCH=$(mktemp -d)  # the trees timed against this one
source scripts/gpu_wheels.sh >/dev/null 2>&1 || true
{ nvidia-smi --query-gpu=name,driver_version --format=csv
  python3 -c 'import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)'; date -u; } > "$OUT/env.txt" 2>&1
variant() {  # NAME OVERLAY
  rm -rf $SCRATCH/$1; mkdir $SCRATCH/$1; (cd $REPO && tar --exclude=./.probe --exclude=./.whl -cf - .) | tar -xf - -C $SCRATCH/$1
  cp -r $REPO/.probe/$2/. $SCRATCH/$1/
}
ab() {  # NAME SUITE PATTERN...
  local name=$1 suite=$2; shift 2
  for pattern in "$@"; do
    echo "== $name $suite --case '$pattern'" | tee -a "$OUT/ab.log"
    (cd $SCRATCH/$name && PYTHONPATH=/tmp/site:$SCRATCH/$name python3 scripts/kernel_ab.py $suite --case "$pattern" --base-dir "$REPO" --rounds 6 \
        --out "$OUT/${name}_${suite}_${pattern//[^a-z0-9]/}.json") 2>&1 | grep '^|' | tail -n 20 | tee -a "$OUT/ab.log"
  done
}
variant trim prefill
variant lpt prefill_lpt
ab trim gpu_peers 'prefill_*' 'chunked*' 'spec_verify*'
ab lpt gpu_peers 'prefill_*' 'chunked*'
ab trim gpu '*prefill*' '*verify*' '*mixed*'
(cd "$OUT" && tar -czf ab_json.tgz *.json && rm -f *.json)
(cd $SCRATCH/trim && PYTHONPATH=/tmp/site:$SCRATCH/trim python3 -m pytest -q -n 4 -p no:cacheprovider -m gpu tests/test_tlsim_predicts_triton.py tests/test_kernel_edges.py \
    tests/test_backends_match_oracle.py 2>&1 | tail -n 30) > "$OUT/pytest.log"
tail -n 3 "$OUT/pytest.log"
