# One GPU call: the ragged-split probe, kernel_ab on the fp8 cases (rev kernel against the tree's), the GPU tests.
set -u
cp -r ../../.whl . && source scripts/gpu_wheels.sh || exit 1
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"; date -u; } > $OUT/env.txt 2>&1
timeout 200 python3 gpu_results/2026-12-01-h200-ragged-split/probe.py $OUT/probe.json 2 > $OUT/probe.log 2>&1; echo "probe rc $?" >> $OUT/probe.log
REV=$(mktemp -d) && cp -r kernels harness scripts cases tests pyproject.toml gpu_results $REV/ 2>/dev/null
sed -i 's/^    split = tl.program_id(2)$/    split = NUM_SPLITS - 1 - tl.program_id(2)/' $REV/kernels/triton_paged.py
grep -c "NUM_SPLITS - 1 - tl.program_id(2)" $REV/kernels/triton_paged.py > $OUT/ab.log
(cd $REV && PYTHONPATH=$PYTHONPATH:$REV timeout 120 python3 gpu_results/2026-12-01-h200-fp8-round2/ab_nogit.py $OLDPWD/base_triton_paged.py variants --case 'llama3_8b_decode_*' --rounds 6 --out $OUT/ab.json) >> $OUT/ab.log 2>&1; echo "ab rc $?" >> $OUT/ab.log
timeout 150 python3 -m pytest -q -x -n 8 -p no:cacheprovider -m "gpu or not gpu" tests/test_variants_fp8.py tests/test_tlsim_predicts_triton.py tests/test_kernel_tuning.py > $OUT/pytest.log 2>&1; echo "pytest rc $?" >> $OUT/pytest.log
date -u >> $OUT/env.txt
tail -25 $OUT/probe.log; tail -6 $OUT/ab.log; tail -3 $OUT/pytest.log
