# Sourced by the device scripts: install the carried wheels (.whl: gguf, fla-core, ...) into /tmp/site, which the
# GPU machine's Python lacks, and put them and the repo on PYTHONPATH.
# Inside a batch (tools/device/parts.sh) they are installed already: installing again would replace packages under
# the batch's other queue.
[ -n "${DEVICE_PARTS:-}" ] && return 0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD
