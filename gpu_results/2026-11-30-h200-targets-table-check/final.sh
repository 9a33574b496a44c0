# One H200: the kernel targets at this tree; the outputs go to $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
source scripts/gpu_wheels.sh || exit 1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
  date -u; } > $OUT/versions.txt
timeout -s TERM 170 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ --ignore=tests/test_peer_flex_paged.py > $OUT/gpu_tests.log 2>&1
echo "pytest exit $?" >> $OUT/gpu_tests.log
timeout -s TERM 200 python3 -m harness run cases/gpu.toml cases/gpu_peers.toml --device cuda --oracle-device cuda --no-progress \
  --backend triton --backend cache --backend sdpa_contiguous --backend varlen_flash --out $OUT/peers > $OUT/peers.log 2>&1
echo "run exit $?" >> $OUT/peers.log
[ -f $OUT/peers/meta.json ] || python3 -m harness run --resume $OUT/peers --finalize >> $OUT/peers.log 2>&1
python3 scripts/kernel_targets.py $OUT/peers > $OUT/targets.md 2>&1
rm -f $OUT/peers/*.csv
{ timeout -s TERM 50 python3 scripts/host_overhead.py; timeout -s TERM 50 python3 scripts/host_overhead.py --shape decode_4x16k; } > $OUT/host_overhead.txt 2>&1
timeout -s TERM 90 python3 scripts/measure_tlsim_closeness.py > $OUT/tlsim_closeness.txt 2>&1
cd $OUT && tar czf peers.tgz peers && rm -rf peers
tail -3 $OUT/gpu_tests.log; grep "^## " $OUT/targets.md
