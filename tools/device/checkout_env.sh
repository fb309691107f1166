# Sourced by the GPU check scripts run from the root of a checkout (not a packed tree: setup.sh):
# installs the carried Vulkan loader .debs (.gl/) and wheels (.whl/: qdc's dependencies; .qwhl/:
# Quadrants and its own, where carried) into /tmp/site, makes this checkout importable as qdc,
# points Vulkan at NVIDIA's driver, and opens $OUT with a `left BUDGET` helper: the seconds of a
# budget of BUDGET that remain since sourcing, and `host_log NAME COMMIT [LINE...]`: the commit
# under test (the checkout's HEAD where COMMIT is empty), the GPU, the cores, the load and the
# given lines, shown and kept in $OUT/NAME_host.log.
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
T0=$(date +%s)
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 1 ? s : 1 )); }
host_log() {
    {
        echo "commit: ${2:-$(git rev-parse --short HEAD 2>/dev/null)}"
        nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; uptime
        local line
        for line in "${@:3}"; do echo "$line"; done
    } | tee "$OUT/$1_host.log"
}

for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
for wheels in .whl .qwhl; do
    ls $wheels/*.whl >/dev/null 2>&1 || continue
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        $wheels/*.whl 2>&1 | grep -v WARN | tail -3
done
mkdir -p /tmp/pp && ln -sfn "$PWD" /tmp/pp/qdc
export PYTHONPATH=/tmp/pp:/tmp/site QDC_CACHE_DIR=/tmp/qc PYTHONUNBUFFERED=1
export PATH=/tmp/site/bin:/tmp/site/cmeel.prefix/bin:$PATH LD_LIBRARY_PATH=/tmp/site/cmeel.prefix/lib:${LD_LIBRARY_PATH:-}
