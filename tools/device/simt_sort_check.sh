#!/bin/bash
# Block-level code and qd.algorithms.sort on an NVIDIA GPU, in at most ~5 minutes:
# bench/bench_simt.py at 2^24 on cuda and vulkan beside Quadrants (and torch), the qd.simt tests
# on cuda and vulkan (the sort against numpy, device-computed grids, the sort's PTX), then where
# the sort's Vulkan device time goes, per task (bench/vulkan_dispatch_times.py).
#
# Run from the root of a checkout that carries .gl/ (the Vulkan loader .debs), .whl/ (qdc's
# dependencies) and .qwhl/ (Quadrants and its dependencies), as tools/device/gather.sh and
# docs/gpu-testing.md describe; logs go to $OUT. Argument: the commit under test, for the logs.
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/simt_out}
source tools/device/checkout_env.sh
host_log simt "$1" "$(python3 -c "import quadrants; print('quadrants', quadrants.__version__)" 2>&1 | tail -1)"

timeout "$(left 100)" python3 bench/bench_simt.py --arch cuda --log2n 24 --rounds 10 2>&1 | grep -v "^\[I" \
    | tee "$OUT/simt_bench_cuda.log"
timeout "$(left 185)" python3 bench/bench_simt.py --arch vulkan --log2n 24 --rounds 10 2>&1 | grep -v "^\[I" \
    | tee "$OUT/simt_bench_vulkan.log"
timeout "$(left 270)" python3 -m pytest -q -p no:cacheprovider tests/language/test_simt_algorithms.py \
    tests/language/test_simt.py tests/language/test_simt_graph_do_while.py tests/devices/vulkan/test_vulkan_device_grids.py \
    tests/targets/cuda/test_cuda_simt.py --archs=vulkan,cuda -rfE 2>&1 | tee "$OUT/simt_tests.log" | tail -8
echo "benchmarks and tests: $(( $(date +%s) - T0 )) s"

timeout "$(left 298)" python3 bench/vulkan_dispatch_times.py --top 12 -- bench/bench_simt.py --arch vulkan --log2n 24 \
    --rounds 2 --without-quadrants 2>&1 | grep -v "^\[I" | tee "$OUT/simt_vulkan_dispatches.log" | tail -16
echo "all: $(( $(date +%s) - T0 )) s" | tee -a "$OUT/simt_host.log"
