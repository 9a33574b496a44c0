# The re-check call (the first stopped at a failing test, with -x): the tlsim gap on the bf16 MLA case for three
# layouts, the same tests without -x under the committed "half_latent" keys, and a short probe (PROBE_SET=recheck).
set -u
export PYTHONUNBUFFERED=1 PROBE_SET=recheck
R=gpu_results/2026-12-02-h200-mla-latent
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; date -u; } > $OUT/env2.txt 2>&1
for label in "base" "latent committed" "latent t32s3" "latent t64s2"; do
  timeout 100 python3 $R/probe.py --warm "$label" >> $OUT/warm2.log 2>&1 &
done
timeout 40 python3 $R/tlsim_gap.py > $OUT/tlsim_gap.log 2>&1; echo "rc $?" >> $OUT/tlsim_gap.log
timeout 100 python3 -m pytest -q -n 6 -p no:cacheprovider -m "gpu or not gpu" tests/test_variants_mla.py \
  tests/test_tlsim_predicts_triton.py tests/test_backends_match_oracle.py tests/test_attention_variants.py \
  -k "mla or head_dim_v or 576 or latent" > $OUT/pytest2.log 2>&1
echo "pytest rc $?" >> $OUT/pytest2.log
wait
timeout 50 python3 $R/probe.py $OUT/probe2.json 2 > $OUT/probe2.log 2>&1; echo "probe rc $?" >> $OUT/probe2.log
date -u >> $OUT/env2.txt
cat $OUT/tlsim_gap.log; tail -12 $OUT/probe2.log; tail -8 $OUT/pytest2.log
