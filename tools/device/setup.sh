# Sourced on an offline GPU host from the folder holding .gl/, .whl/, .gpu/ and tools/device/
# (`source tools/device/setup.sh`; docs/gpu-testing.md): installs the
# carried loader .debs and wheels (tools/device/gather.sh), unpacks the tree under test
# (tools/device/pack.sh) at /tmp/pp/qdc and points PYTHONPATH, PATH and the qdc cache there.
set -e
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | grep -v WARN | tail -3 || true
mkdir -p /tmp/pp/qdc && tar -xf .gpu/tree.tar -C /tmp/pp/qdc
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m qdc.cli.main "$@"\n' > /tmp/bin/qdc && chmod +x /tmp/bin/qdc  # the console script
export PYTHONPATH=/tmp/pp:/tmp/site QDC_CACHE_DIR=/tmp/qc PATH=/tmp/bin:/tmp/site/bin:/tmp/site/cmeel.prefix/bin:$PATH
export LD_LIBRARY_PATH=/tmp/site/cmeel.prefix/lib:${LD_LIBRARY_PATH:-}
cd /tmp/pp/qdc
set +e
