#!/bin/bash
# The shared LLVM lowering's reuse of ctx words and widened indices within a block
# (compiler/targets/llvm/llvm_ir.py, `_Env.in_block`) on an NVIDIA GPU, in at most ~5 minutes: the
# language tests that read and write fields and ndarrays (several axes, constant and computed
# indices, branches and loops), on cuda against numpy, plus the debug mode's bounds checks, whose
# reported indices are the widened ones.
#
# Run from the root of a checkout that carries .gl/ (the Vulkan loader .debs) and .whl/ (qdc's
# dependencies), as tools/device/gather.sh and docs/gpu-testing.md describe; logs go to $OUT.
# Argument: the commit under test, for the logs.
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/llvm_block_values_out}
source tools/device/checkout_env.sh
host_log llvm_block_values "$1"

timeout "$(left 280)" python3 -m pytest -q -p no:cacheprovider tests/language/test_ndarray_args.py \
    tests/language/test_language_fields.py tests/language/test_vector_fields.py tests/language/test_matrices.py \
    tests/language/test_language_control.py tests/language/test_debug_mode.py --archs=cuda -rfE 2>&1 \
    | tee "$OUT/llvm_block_values_tests.log" | tail -8
echo "total: $(( $(date +%s) - T0 )) s"
