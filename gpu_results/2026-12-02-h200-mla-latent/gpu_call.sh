# One GPU call, from the tree's root (after `source scripts/gpu_wheels.sh`): each candidate compiled in a
# process of its own while the MLA tests run, then the side-by-side probe alone on the GPU.
set -u
export PYTHONUNBUFFERED=1
R=gpu_results/2026-12-02-h200-mla-latent
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"; date -u; } > $OUT/env.txt 2>&1
labels=$(python3 -c "import runpy; m = runpy.run_path('$R/probe.py', run_name='x'); print('\n'.join(c[0] for c in m['CANDIDATES']))")
while IFS= read -r label; do timeout 170 python3 $R/probe.py --warm "$label" >> $OUT/warm.log 2>&1 & done <<< "$labels"
timeout 170 python3 -m pytest -q -x -n 6 -p no:cacheprovider -m "gpu or not gpu" tests/test_variants_mla.py \
  tests/test_tlsim_predicts_triton.py tests/test_backends_match_oracle.py tests/test_attention_variants.py \
  -k "mla or head_dim_v or 576 or latent" > $OUT/pytest.log 2>&1
echo "pytest rc $?" >> $OUT/pytest.log
wait
date -u >> $OUT/env.txt
timeout 200 python3 $R/probe.py $OUT/probe.json 2 > $OUT/probe.log 2>&1; echo "probe rc $?" >> $OUT/probe.log
date -u >> $OUT/env.txt
tail -30 $OUT/probe.log; tail -4 $OUT/pytest.log; grep -c error $OUT/warm.log
