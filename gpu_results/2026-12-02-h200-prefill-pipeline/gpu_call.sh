# One GPU call, from the tree's root (after `source scripts/gpu_wheels.sh`): the side-by-side probe of the
# prefill tile-loop candidates, then the kernel's tests on the GPU with the new prefill entry.
set -u
export PYTHONUNBUFFERED=1
R=gpu_results/2026-12-02-h200-prefill-pipeline
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"; date -u; } > $OUT/env.txt 2>&1
timeout 210 python3 $R/probe.py $OUT/probe.json 2 head_triton_paged.py > $OUT/probe.log 2>&1; echo "probe rc $?" >> $OUT/probe.log
timeout 110 python3 -m pytest -q -n 8 -p no:cacheprovider -m "gpu or not gpu" tests/test_kernel_pv_lag.py \
  tests/test_tlsim_predicts_triton.py tests/test_kernel_tuning.py tests/test_launch_plans.py tests/test_kernel_sync_free.py \
  tests/test_dispatch.py > $OUT/pytest.log 2>&1
echo "pytest rc $?" >> $OUT/pytest.log
date -u >> $OUT/env.txt
tail -40 $OUT/probe.log; tail -6 $OUT/pytest.log
