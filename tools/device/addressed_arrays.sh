#!/bin/bash
# On a GPU host, from the repository root (offline: after `source tools/device/setup.sh`,
# docs/gpu-testing.md): tasks that reach their arrays by buffer device address, on the host's
# Vulkan driver. Runs their tests and the small-launch tests there, then
# bench/bench_addressed_arrays.py (the same kernel with its arrays bound and by address), and,
# where this checkout has its git history, the benchmark again with the code of b277955 (base
# pointers rebuilt from two words at every access) for comparison. Logs to $OUT (default: .).
# About 3 minutes on an H200.
set -u
out=${OUT:-.}
(nvidia-smi -L; python3 -c "from qdc.runtime.devices.vulkan.device import VulkanDevice as D; print(D().capabilities.name)") \
    > "$out/device.txt" 2>&1
timeout 240 python3 -m pytest -q -rfEs tests/targets/spirv/test_spirv_addressed_arrays.py \
    tests/devices/vulkan/test_vulkan_small_launches.py --archs=vulkan > "$out/tests.log" 2>&1
timeout 150 python3 bench/bench_addressed_arrays.py --log2n 24 --rounds 3 > "$out/bench_now.log" 2>&1
if git rev-parse --verify -q b277955 > /dev/null; then
    rm -rf /tmp/qdc-before && mkdir -p /tmp/qdc-before/qdc && git archive b277955 | tar -x -C /tmp/qdc-before/qdc
    PYTHONPATH=/tmp/qdc-before:${PYTHONPATH:-} timeout 150 python3 bench/bench_addressed_arrays.py --log2n 24 \
        --rounds 3 > "$out/bench_b277955.log" 2>&1
fi
tail -n 4 "$out"/device.txt "$out"/tests.log "$out"/bench_*.log
