#!/bin/bash
# Gathers what an offline GPU host (x86-64, Python 3.12, torch and the scientific stack already
# installed: docs/gpu-testing.md) lacks to run Genesis 1.4.5's plane+box and Franka scenes
# (bench/genesis_scene.py) through tools/device/genesis_gpu.sh: cp312 wheels of genesis-world and
# of the packages its import, scene building and stepping really load, into an ignored folder
# (default .gen/wheels of this checkout; `genesis_pack.sh DIR` writes DIR/wheels). Needs PyPI.
#
# What travels to such a host is bounded (64 MiB with the tree and .whl/), so:
# - genesis-world keeps its code and, of its 206 MB of assets, the two these scenes open: the
#   Franka arm's MJCF with its meshes and the plane's checker texture;
# - every wheel is recompressed with LZMA (zip method 14, which pip installs like any other);
# - packages that Genesis imports but these scenes never call and that don't fit are left out and
#   stood in for by genesis_gpu.sh (it says which and why); packages the host has are left out.
# The list below was found with `python -X importtime` and a profile of every call into
# third-party modules while building and stepping both scenes with an empty Genesis cache.
set -euo pipefail
root="$(dirname "$(readlink -f "$0")")/../.."
out="${1:-$root/.gen}"
download="${GENESIS_PACK_DOWNLOADS:-/tmp/genesis-pack-downloads}"
mkdir -p "$out/wheels" "$download"

# Imported at module level and used: mujoco (MJCF parsing), trimesh, pydantic (options),
# frozendict, pygltflib/DracoPy (URDF/glTF readers), PyOpenGL, pyglet, freetype-py (the
# visualizer's modules, imported at build even without a viewer). Imported only: the rest.
wheels=(
    genesis-world==1.4.5
    mujoco==4.0.1 mujoco-core==4.0.1 glfw==2.11.0 PyOpenGL==3.1.10
    trimesh==5.2.0 rtree==1.4.1
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
    typing-extensions==4.16.0
    dataclasses-json==0.6.7 marshmallow==3.26.2 frozendict==2.5.1
    DracoPy==2.2.0 OpenEXR==3.5.3 coacd==1.0.14 libigl==2.6.3 tetgen==0.8.2
    fast-simplification==0.2.0 xacro==2.1.1 zstandard==0.25.0
    pyglet==2.1.19 freetype-py==2.5.1 PyGEL3D==0.8.2
)
platforms=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_12 \
         manylinux2010 manylinux_2_5 manylinux1; do
    platforms+=(--platform "${p}_x86_64")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform any -d "$download" "${wheels[@]}"
# genesis-world 1.4.5 pins pygltflib 1.16.0, published as a source distribution only (pure Python)
python3 -m pip wheel -q --no-deps -w "$download" pygltflib==1.16.0

python3 - "$download" "$out/wheels" <<'PY'
import base64, csv, glob, hashlib, io, os, sys, zipfile

source, target = sys.argv[1:]
# genesis-world's assets that the two scenes open (found with an audit hook on `open`; MuJoCo reads
# the meshes panda.xml names from C)
GENESIS_ASSETS = ("genesis/assets/xml/franka_emika_panda/panda.xml",
                  "genesis/assets/xml/franka_emika_panda/assets/",
                  "genesis/assets/textures/checker.png")


def keep(wheel, name):
    if os.path.basename(wheel).startswith("genesis_world-") and name.startswith("genesis/assets/"):
        return name.startswith(GENESIS_ASSETS)
    return True


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


for wheel in sorted(glob.glob(os.path.join(source, "*.whl"))):
    dest = os.path.join(target, os.path.basename(wheel))
    if os.path.exists(dest) and os.path.getmtime(dest) >= os.path.getmtime(wheel):
        continue
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(dest + ".tmp", "w", zipfile.ZIP_LZMA) as dst:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        rows = []
        for item in src.infolist():
            if item.filename == record_name or not keep(wheel, item.filename):
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
    print(f"{os.path.getsize(wheel) / 1e6:7.2f} -> {os.path.getsize(dest) / 1e6:6.2f} MB "
          f"{os.path.basename(wheel)}")
PY
du -sh "$out"
