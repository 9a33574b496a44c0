#!/bin/bash
# Dispatch order of decode programs: heads fastest (A), and longest piece first under the device split (B),
# each against main's kernel (kernel_ab, 6 rounds); base's fp8 / twin ratio comes from the same process.
set -u -o pipefail
REPO=$PWD
source scripts/gpu_wheels.sh >/dev/null 2>&1 || true
{ nvidia-smi --query-gpu=name,driver_version --format=csv
  python3 -c 'import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)'; date -u; } > "$OUT/env.txt" 2>&1
mk() { local d; d=$(mktemp -d); (tar --exclude=./.probe --exclude=./.whl -cf - .) | tar -xf - -C "$d"; echo "$d"; }
BASE=$(mk); cp .probe/base/triton_paged.py "$BASE/kernels/triton_paged.py"
A=$(mk); sed -i 's/^LONGEST_FIRST = True$/LONGEST_FIRST = False/' "$A/kernels/triton_paged.py"
B=$(mk)
grep -n '^HEADS_FIRST\|^LONGEST_FIRST' "$A/kernels/triton_paged.py" "$B/kernels/triton_paged.py" | sed "s#$A#A#;s#$B#B#" > "$OUT/variants.txt"
ab() {  # tree label suite pattern
  echo "== $2 $(basename "$3") --case '$4'" | tee -a "$OUT/ab.log"
  (cd "$1" && PYTHONPATH=/tmp/site:$1 timeout 240 python3 scripts/kernel_ab.py "$3" --case "$4" --base-dir "$BASE" --rounds 6) \
    2>&1 | grep '^|\|kernel_ab' | tee -a "$OUT/ab.log"
}
ab "$B" B gpu 'llama3_8b_decode*'
ab "$B" B gpu_peers 'decode_*'
ab "$A" A gpu 'llama3_8b_decode*'
ab "$B" B gpu '*hd*_decode'
ab "$B" B gpu 'llama3_70b_tp8_decode'
ab "$B" B gpu 'deepseek*'
ab "$B" B gpu_long '*decode_128k'
(cd "$B" && PYTHONPATH=/tmp/site:$B timeout 150 python3 -m pytest -q -n 4 -p no:cacheprovider -m gpu \
   tests/test_tlsim_predicts_triton.py tests/test_kernel_edges.py tests/test_variants_fp8.py tests/test_variants_mla.py 2>&1 | tail -n 5) > "$OUT/pytest.log"
cat "$OUT/pytest.log"
