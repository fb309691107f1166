# The README's two commands are `make demo` and `make test`; both set up a fresh machine.
PY ?= python3
PIP = $(PY) -m pip install -q --disable-pip-version-check

.PHONY: setup demo test test-gpu bench clean

setup:
	$(PIP) -e '.[test,vulkan]'

demo: setup
	$(PY) -m qdc.cli.main build kernels/ --cache cache
	$(PY) kernels/run_example.py cache

test: setup
	@command -v qemu-x86_64 >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && { apt-get update -qq && apt-get install -y -qq qemu-user >/dev/null; } || echo "qdc: qemu-x86_64 is missing and could not be installed with apt-get (package qemu-user): the test of portable CPU code on a CPU without AVX-512 will be skipped"; }
	@{ ldconfig -p 2>/dev/null | grep -q libvulkan.so.1 && ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1; } || { command -v apt-get >/dev/null 2>&1 && { apt-get update -qq && apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null; } || echo "qdc: the Vulkan loader or lavapipe is missing and could not be installed with apt-get (packages mesa-vulkan-drivers libvulkan1): the vulkan tests will be skipped"; }
	@{ command -v spirv-cross >/dev/null 2>&1 && command -v ld.lld-16 >/dev/null 2>&1; } || { command -v apt-get >/dev/null 2>&1 && { apt-get update -qq && apt-get install -y -qq spirv-cross lld-16 >/dev/null; } || echo "qdc: spirv-cross or ld.lld (packages spirv-cross lld-16) is missing and could not be installed with apt-get: the Metal and AMDGPU target tests will be skipped"; }
	@sh tools/cross/aarch64-sysroot.sh .cross/aarch64 || echo "qdc: the aarch64 sysroot (Debian arm64 CPython, numpy, msgpack) could not be fetched into .cross/aarch64: the emulated aarch64 deployment tests will be skipped"
	@$(PIP) nvidia-cuda-nvcc || echo "qdc: nvidia-cuda-nvcc could not be installed: the CUDA tests will check PTX without assembling it (ptxas) and skip kernels that need libdevice"
	@$(PIP) torch==2.13.0 || echo "qdc: torch 2.13.0 could not be installed: the PyTorch and DLPack tests will be skipped"
	$(PY) -m pytest -q -rfEsxX tests

# On a machine with an NVIDIA GPU (and its Vulkan driver): every arch-parametrised test on cpu,
# vulkan and cuda, and the GPU-only tests, which skip elsewhere.
test-gpu: setup
	$(PIP) -e '.[test,vulkan,cuda]'
	$(PY) -m pytest -q -rfEsxX tests --archs=cpu,vulkan,cuda

bench: setup
	$(PIP) quadrants || echo "quadrants is not installable here: the table will leave its column out"
	$(PY) bench/run.py

clean:
	rm -rf cache/* build *.egg-info .pytest_cache
