#!/bin/bash
# Genesis 1.4.5's plane+box and Franka scenes (bench/genesis_scene.py) on qdc on an offline GPU host
# (x86-64, Python 3.12 with torch and the scientific stack: docs/gpu-testing.md), within 8 minutes:
#   1. Genesis with `gs.init(backend=gs.cuda)`: its GPU configuration, torch on the GPU, the kernels
#      on qdc's cuda arch; an empty kernel cache (cold `scene.build()`), then a second process (warm);
#   2. the CPU reference: `gs.init(backend=gs.cpu)`, qdc's cpu arch;
#   3. Genesis's GPU configuration with the kernels on qdc's vulkan arch, as time allows (`--backend
#      cuda --arch vulkan --torch-cpu`: Genesis has no Vulkan backend, bench/genesis_scene.py says
#      how; torch stays on the CPU, as kernels on arch vulkan take CPU tensors, not CUDA ones).
# Each run steps 100 times; positions are checked against the CPU run (1e-4). Logs and a summary go
# to $OUT (default /tmp/genesis-gpu).
#
#   tools/device/genesis_gpu.sh [PACK]        # from a checkout holding PACK (default .gen: the
#                                             # wheels of tools/device/genesis_pack.sh), .whl/ and .gl/
#                                             # (tools/device/gather.sh)
#
# GENESIS_RUNS picks the runs (default "cuda cpu vulkan"; "cpu vulkan" on a machine without an NVIDIA
# GPU, e.g. on lavapipe); PYTHON the interpreter (default python3); GENESIS_DEADLINE the seconds in
# all (470).
#
# Two stand-ins, for this harness only: Genesis imports `av` (video recording options) and `z3`
# (solving collision bit masks of MJCF files) at module level, but these scenes never call either
# (a profile of every call into third-party modules while building and stepping both scenes, with
# an empty Genesis cache, found none), and their wheels (36 MB and 29 MB) don't fit in what a call to
# the host carries. Empty modules stand in for them: any attribute read raises an AttributeError
# that says so. Everything else Genesis loads is the real package (genesis_pack.sh lists them).
set -u
cd "$(dirname "$(readlink -f "$0")")/../.."
pack="${1:-.gen}"
out="${OUT:-/tmp/genesis-gpu}"
py="${PYTHON:-python3}"
runs="${GENESIS_RUNS-cuda cpu vulkan}"
deadline=$(( $(date +%s) + ${GENESIS_DEADLINE:-470} ))
mkdir -p "$out"
log="$out/genesis.log"
results="$out/results.jsonl"
: > "$results"
say() { echo "$*" | tee -a "$log"; }

if [ ! -d "$pack/wheels" ]; then
    say "error: no $pack/wheels: build it with tools/device/genesis_pack.sh and carry it"; exit 2
fi
if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
    if [ -d .gl ] && [ "$(id -u)" = 0 ]; then  # the Vulkan loader and EGL the image lacks
        for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
    fi
    icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    [ -f "$icd" ] && export VK_DRIVER_FILES="$icd"
fi

site=/tmp/genesis-site stubs=/tmp/genesis-stubs
extra_wheels=$(ls .whl/*.whl 2> /dev/null)  # vulkan, cffi, spirv-tools, nvvm (tools/device/gather.sh)
"$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    $extra_wheels "$pack"/wheels/*.whl 2>&1 | grep -v WARN | tee -a "$log"
for name in av z3; do
    mkdir -p "$stubs/$name"
    cat > "$stubs/$name/__init__.py" <<EOF
"""A stand-in for the $name package, written by tools/device/genesis_gpu.sh: Genesis imports it at
module level, the scenes of that harness never use it, and its wheel does not fit what they carry."""


def __getattr__(attribute):
    raise AttributeError(f"'$name' is a stand-in of tools/device/genesis_gpu.sh without {attribute!r}: "
                         "install the real package to use it")
EOF
done
mkdir -p /tmp/genesis-pp && ln -sfn "$PWD" /tmp/genesis-pp/qdc
export PYTHONPATH="/tmp/genesis-pp:$site:$stubs" PYTHONUNBUFFERED=1
export PATH="$site/bin:$site/cmeel.prefix/bin:$PATH" LD_LIBRARY_PATH="$site/cmeel.prefix/lib:${LD_LIBRARY_PATH:-}"

# The packages of the host that Genesis and qdc import, then Genesis itself: all missing ones at once.
"$py" - <<'PY' 2>&1 | tee -a "$log"
import importlib, sys
host = ("numpy torch scipy PIL psutil cpuinfo numba llvmlite networkx sympy mpmath matplotlib skimage "
        "lazy_loader yaml tqdm typing_inspect mypy_extensions msgpack click colorama packaging").split()
missing = []
for name in host:
    try:
        importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - any failure to import is reported the same way
        missing.append(f"{name} ({type(e).__name__}: {e})")
if missing:
    sys.exit("error: this host lacks packages Genesis imports, carry their cp312 wheels in the pack "
             "(tools/device/genesis_pack.sh): " + "; ".join(missing))
import numpy, torch
print(f"python {sys.version.split()[0]}, numpy {numpy.__version__}, torch {torch.__version__} "
      f"(cuda available: {torch.cuda.is_available()})")
import qdc
qdc.install_as_quadrants()
import genesis
print(f"genesis {genesis.__version__} from {genesis.__file__}, qdc from {qdc.__file__}")
PY
[ "${PIPESTATUS[0]}" = 0 ] || { say "error: Genesis cannot be imported (above)"; exit 2; }

# run LABEL SCENE CACHE TIMEOUT ARGS...: one bench/genesis_scene.py process, with qdc's kernel cache
# and Genesis's own (meshes, convex hulls) in CACHE; its JSON line, labelled, goes to results.jsonl,
# the rest of its output to $runlog
runlog=$log
run() {
    local label=$1 scene=$2 cache=$3 limit=$4; shift 4
    local left=$(( deadline - $(date +%s) ))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 20 ]; then echo "skipped $label $scene: out of time" | tee -a "$runlog"; return; fi
    echo "== $label $scene ($*), at most ${limit}s" | tee -a "$runlog"
    local t0=$(date +%s%N) printed
    printed=$(mktemp)
    GS_CACHE_FILE_PATH="$cache/genesis" QDC_CACHE_DIR="$cache" timeout "$limit" \
        "$py" bench/genesis_scene.py "$scene" 100 --qdc "$@" > "$printed" 2>> "$runlog"
    local rc=$?
    cat "$printed" >> "$runlog"
    echo "   $label $scene: exit $rc after $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$runlog"
    local line=$(grep '^{' "$printed" | tail -1)
    [ -n "$line" ] && echo "{\"label\": \"$label\", \"scene\": \"$scene\", \"result\": $line}" >> "$results"
    rm -f "$printed"
}

# The CPU reference runs beside the GPU runs (its own process and log: a host of many cores; the GPU
# timings are of processes that had a core each), the GPU runs one after another.
reference=""
if [[ " $runs " == *" cpu "* ]]; then
    (runlog="$out/genesis-cpu.log"
     for scene in box franka; do rm -rf "/tmp/gq-cpu-$scene"; run cpu $scene "/tmp/gq-cpu-$scene" 300 --backend cpu; done) &
    reference=$!
fi
for what in $runs; do
    for scene in box franka; do
        case $what in
            cuda) rm -rf "/tmp/gq-cuda-$scene"
                  run cuda-cold $scene "/tmp/gq-cuda-$scene" 200 --backend cuda
                  run cuda-warm $scene "/tmp/gq-cuda-$scene" 60 --backend cuda ;;
            vulkan) rm -rf "/tmp/gq-vulkan-$scene"
                    run vulkan-cold $scene "/tmp/gq-vulkan-$scene" 200 --backend cuda --arch vulkan --torch-cpu ;;
            cpu) ;;
            *) say "error: unknown run '$what' (cuda, cpu, vulkan)"; exit 2 ;;
        esac
    done
done
[ -n "$reference" ] && wait "$reference"

"$py" - "$results" <<'PY' 2>&1 | tee "$out/summary.txt" | tee -a "$log"
import json, sys
import numpy as np
rows = [json.loads(line) for line in open(sys.argv[1])]
# Genesis's CPU configuration (the reference of the check) and its GPU configuration on cuda (the
# same algorithms as the vulkan runs: their agreement checks the two GPU arches against each other)
cpu = {r["scene"]: np.asarray(r["result"]["pos"]) for r in rows if r["label"] == "cpu"}
cuda = {r["scene"]: np.asarray(r["result"]["pos"]) for r in rows if r["label"] == "cuda-cold"}


def difference(reference, r):
    if r["scene"] not in reference:
        return None
    return float(np.max(np.abs(np.asarray(r["result"]["pos"]) - reference[r["scene"]])))


def text(d):
    return "-" if d is None else f"{d:.1e}"


print("| run | scene | backend / arch / torch | build s | first step s | step ms | compiles "
      "| max abs(pos - cpu) | max abs(pos - cuda) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
failed = []
for r in rows:
    res = r["result"]
    d_cpu, d_cuda = difference(cpu, r), difference(cuda, r)
    if d_cpu is not None and not d_cpu <= 1e-4:
        failed.append(f"{r['label']} {r['scene']} ({d_cpu:.1e})")
    print(f"| {r['label']} | {r['scene']} | {res['backend']} / {res['arch']} / {res['torch']} | {res['build']:.2f} "
          f"| {res['first_step']:.3f} | {res['step'] * 1e3:.3f} | {res['compiles']} | {text(d_cpu)} | {text(d_cuda)} |")
print("final positions:")
for r in rows:
    print(f"  {r['label']} {r['scene']}: {np.round(np.asarray(r['result']['pos']), 6).tolist()}")
print("positions beyond 1e-4 of the CPU run: " + (", ".join(failed) if failed else "none"))
PY
