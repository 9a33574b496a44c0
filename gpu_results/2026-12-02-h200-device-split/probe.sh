#!/bin/bash
# The device split against main, side by side in one process, then the GPU tests with the switch on.
# Run from the root of a copy of this branch (the copy is changed: its kernels/tiling.py gets the switch
# on); everything it writes goes under $OUT (6 files).
set -u -o pipefail
: "${OUT:?set OUT to an empty folder}"
MAIN_REV=c897e21  # main when the branch was cut
BASE=$(mktemp -d)
if git rev-parse -q --verify "$MAIN_REV^{commit}" >/dev/null 2>&1; then
    git archive "$MAIN_REV" | tar -x -C "$BASE"
    echo "base: main at $MAIN_REV (git archive)" | tee "$OUT/ab.log"
else  # no history here: this branch as it is (switch off), which compiles to main's SASS (README)
    cp -r kernels "$BASE/"
    echo "base: this branch with DEVICE_SPLIT = False (no git here)" | tee "$OUT/ab.log"
fi
sed -i 's/^DEVICE_SPLIT = False$/DEVICE_SPLIT = True/' kernels/tiling.py
grep -q '^DEVICE_SPLIT = True$' kernels/tiling.py || { echo "the switch did not flip" | tee -a "$OUT/ab.log"; exit 2; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c 'import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)'; } > "$OUT/env.txt" 2>&1
status=0
for run in "gpu:llama3_8b_decode*" "gpu_peers:decode_*" "gpu_long:*decode_128k"; do
    suite=${run%%:*} pattern=${run#*:}
    echo "== $suite --case '$pattern'" | tee -a "$OUT/ab.log"
    python3 scripts/kernel_ab.py "$suite" --case "$pattern" --base-dir "$BASE" --with tiling tuning --rounds 6 \
        --out "$OUT/ab_$suite.json" 2>&1 | tee -a "$OUT/ab.log" || status=1
done
python3 -m pytest -q -n 8 -p no:cacheprovider -m gpu tests/test_tlsim_predicts_triton.py tests/test_kernel_sync_free.py \
    tests/test_backends_match_oracle.py 2>&1 | tail -n 60 > "$OUT/pytest.log" || status=1
tail -n 3 "$OUT/pytest.log"
exit $status
