# One GPU call, from the tree's root (run after `source scripts/gpu_wheels.sh` at the checkout's root):
# the side-by-side probe, the MLA tests on the GPU, the MLA cases through the harness.
set -u
export PYTHONUNBUFFERED=1
R=gpu_results/2026-12-01-h200-mla
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"; date -u; } > $OUT/env.txt 2>&1
timeout 170 python3 $R/probe.py $OUT/probe.json 2 > $OUT/probe.log 2>&1; echo "probe rc $?" >> $OUT/probe.log
timeout 75 python3 -m pytest -q -x -n 8 -p no:cacheprovider -m "gpu or not gpu" tests/test_variants_mla.py \
  tests/test_tlsim_predicts_triton.py tests/test_attention_variants.py -k "mla or head_dim_v or 576" > $OUT/pytest.log 2>&1
echo "pytest rc $?" >> $OUT/pytest.log
timeout 45 python3 -m harness run $R/mla_cases.toml --backend triton --backend tlsim --no-timing --out $OUT/run > $OUT/harness.log 2>&1
echo "harness rc $?" >> $OUT/harness.log
date -u >> $OUT/env.txt
tail -22 $OUT/probe.log; tail -4 $OUT/pytest.log; tail -6 $OUT/harness.log
