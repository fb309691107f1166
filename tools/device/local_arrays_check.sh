#!/bin/bash
# Vector locals indexed at run time (local arrays) on an NVIDIA GPU, in at most ~5 minutes: the
# tests of the feature on cuda and vulkan (forward kernels against numpy, out-of-range indices,
# gradients against central differences, the PTX assembled by ptxas), then
# bench/bench_local_arrays.py on cuda and vulkan (build and run times; against 489f616, the commit
# before local arrays, where the copy carries the repository's history).
#
# Run from the root of a checkout that carries .gl/ (the Vulkan loader .debs) and .whl/ (qdc's
# dependencies), as tools/device/gather.sh and docs/gpu-testing.md describe; logs go to $OUT.
# Argument: the commit under test, for the logs.
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/local_arrays_out}
source tools/device/checkout_env.sh
host_log local_arrays "$1"

timeout "$(left 150)" python3 -m pytest -q -p no:cacheprovider tests/frontend/test_indexed_vector_locals.py \
    tests/autodiff/test_indexed_locals_grad.py tests/targets/llvm/test_llvm_local_arrays.py \
    tests/targets/spirv/test_spirv_local_arrays.py --archs=cpu,vulkan,cuda -rfE 2>&1 \
    | tee "$OUT/local_arrays_tests.log" | tail -8
echo "tests: $(( $(date +%s) - T0 )) s"
# against the commit before local arrays where the copy has the repository's history
AGAINST=$(git rev-parse -q --verify 489f616^{commit} >/dev/null 2>&1 && echo "--against 489f616")
for arch in cuda vulkan; do
    timeout "$(left 280)" python3 bench/bench_local_arrays.py --arch $arch --rounds 3 --n 1048576 $AGAINST 2>&1 \
        | tee "$OUT/local_arrays_bench_$arch.log"
done
echo "total: $(( $(date +%s) - T0 )) s"
