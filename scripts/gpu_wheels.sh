# Sourced by the GPU scripts (gpu_run.sh, gpu_scale.sh): wheels of packages a
# CUDA image may lack (pydantic and its helpers) can travel in .whl/ (ignored by git); they are
# installed into /tmp/site once per machine and put on the paths.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  echo "usage: source scripts/gpu_wheels.sh   (from the repository root; installs .whl/*.whl into /tmp/site)"
  exit 0
fi
if [ -d .whl ]; then
  if [ ! -f /tmp/site/.from-whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || return 1
    touch /tmp/site/.from-whl
  fi
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
fi
