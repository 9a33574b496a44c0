# Sourced by the GPU scripts (gpu_run.sh, gpu_scale.sh, gpu_evidence.sh): the wheels of packages
# the lent machine's image lacks (pydantic and its helpers) travel in .whl/ (README: "Running on a
# lent GPU"); install them into /tmp/site once per machine and put them on the paths.
if [ -d .whl ]; then
  if [ ! -f /tmp/site/.from-whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || return 1
    touch /tmp/site/.from-whl
  fi
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
fi
