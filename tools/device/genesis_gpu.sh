#!/bin/bash
# Genesis 1.4.5's plane+box and Franka scenes (bench/genesis_scene.py) on an offline GPU host
# (x86-64, Python 3.12 with torch and the scientific stack: docs/gpu-testing.md), on qdc and on
# Quadrants, within 8 minutes. The runs, by default in this order (GENESIS_RUNS picks and orders
# them; the cheap prebuilt runs go before Quadrants' cold builds, which take longest):
#   qdc        Genesis with `gs.init(backend=gs.cuda)` (its GPU configuration, torch on the GPU) on
#              qdc's cuda arch: an empty kernel cache (cold `scene.build()`), recording the kernel
#              manifest (QDC_RECORD), then a second process (warm);
#   prebuilt   `qdc build --manifest` of the cold run's manifest into an empty cache, in a process of
#              its own, then a run from that cache that may compile nothing (QDC_OFFLINE=1; Genesis's
#              own cache of meshes is the cold run's);
#   quadrants  the same as qdc on Quadrants 1.3.3 (the version genesis-world 1.4.5 requires), cold
#              and warm;
#   cpu        the reference: `gs.init(backend=gs.cpu)` on qdc's cpu arch, beside the GPU runs from
#              the start (its own processes and log; the host has many cores);
#   vulkan     Genesis's GPU configuration with the kernels on qdc's vulkan arch, cold (`--backend cuda
#              --arch vulkan --torch-cpu`: Genesis has no Vulkan backend, bench/genesis_scene.py says
#              how; torch stays on the CPU, as kernels on arch vulkan take CPU tensors, not CUDA ones).
# Each run steps 100 times; positions are checked against the CPU run (1e-4). Logs, results.jsonl
# (one line a run: scene.build(), first and steady step times, compiles, positions; one line a
# manifest build), the manifests and summary.txt (Markdown tables for docs/benchmarks.md) go to $OUT
# (default /tmp/genesis-gpu). The results of two runs of this script (e.g. GENESIS_RUNS="quadrants cpu"
# after what did not fit) are summarized together by concatenating their results.jsonl:
# `python3 tools/device/genesis_summary.py BOTH.jsonl genesis.log`.
#
#   tools/device/genesis_gpu.sh [PACK]        # from a checkout holding PACK (default .gen: the
#                                             # wheels of tools/device/genesis_pack.sh) and .gl/
#                                             # (the Vulkan loader: tools/device/gather.sh)
#
# GENESIS_RUNS: the runs, in order (default "qdc prebuilt quadrants cpu vulkan"; "cpu vulkan" on a
# machine without an NVIDIA GPU, e.g. on lavapipe). GENESIS_BACKEND: Genesis's backend of the qdc,
# quadrants and prebuilt runs (default cuda; cpu checks those runs on a machine without a GPU).
# GENESIS_SCENES: the scenes, in order (default "box franka"). PYTHON: the interpreter (default
# python3). GENESIS_DEADLINE: the seconds in all (470). GENESIS_SCENE_ARGS: more arguments for every
# bench/genesis_scene.py run (e.g. "--profile-steps $OUT/profiles": where the steps' time goes).
#
# Stand-ins, for this harness only: Genesis imports these packages at module level, but these scenes
# never call them (a profile of every call into third-party modules while building and stepping both
# scenes found none; the stand-ins below fail on any use, and the scenes run with them), and their
# wheels would not leave room for Quadrants in what a call to the host carries: av (video recording
# options, 36 MB), z3 (collision bit masks of MJCF files, 29 MB), zstandard (trajectory recording,
# 4.0 MB), DracoPy (Draco-compressed glTF, 3.6 MB), coacd (convex decomposition, not made of robots
# by default, 1.7 MB), OpenEXR and Imath (EXR textures, 1.3 MB). Empty modules stand in for them:
# any attribute read raises an AttributeError that says so. Everything else Genesis loads is the
# real package (genesis_pack.sh lists them).
set -u
cd "$(dirname "$(readlink -f "$0")")/../.." || exit 2
pack="${1:-.gen}"
out="${OUT:-/tmp/genesis-gpu}"
py="${PYTHON:-python3}"
runs="${GENESIS_RUNS-qdc prebuilt quadrants cpu vulkan}"
scenes="${GENESIS_SCENES:-box franka}"
gpu="${GENESIS_BACKEND:-cuda}"
deadline=$(( $(date +%s) + ${GENESIS_DEADLINE:-470} ))
mkdir -p "$out" && out=$(cd "$out" && pwd)
log="$out/genesis.log"
results="$out/results.jsonl"
: > "$results"; : > "$log"; : > "$out/genesis-cpu.log"
say() { echo "$*" | tee -a "$log"; }
wanted() { [[ " $runs " == *" $1 "* ]]; }

for what in $runs; do
    case $what in qdc|quadrants|prebuilt|cpu|vulkan) ;;
        *) say "error: unknown run '$what' (qdc, quadrants, prebuilt, cpu, vulkan)"; exit 2 ;; esac
done
if [ ! -d "$pack/wheels" ] || [ ! -d "$pack/qdc" ]; then
    say "error: no $pack/wheels or $pack/qdc: build them with tools/device/genesis_pack.sh and carry $pack"; exit 2
fi
commit=$(git rev-parse --short HEAD 2> /dev/null || echo 'an unknown commit')
say "genesis_gpu.sh at $commit, $(date -u '+%Y-%m-%d %H:%M UTC'), runs: $runs, backend $gpu"
cpu_model=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
say "host: $(nproc) cores, $cpu_model, load $(cut -d' ' -f1-3 /proc/loadavg)"
if command -v nvidia-smi > /dev/null; then
    say "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
    if [ -d .gl ] && [ "$(id -u)" = 0 ]; then  # the Vulkan loader and EGL the image lacks
        for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
    fi
    icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    [ -f "$icd" ] && export VK_DRIVER_FILES="$icd"
fi

# qdc's runs import from $site (Genesis, its packages, qdc's requirements), Quadrants' runs from
# $quadrants_site first (Quadrants and dill), then $site; both see the stand-ins last
site=/tmp/genesis-site quadrants_site=/tmp/genesis-quadrants stubs=/tmp/genesis-stubs
rm -rf "$site" "$quadrants_site" "$stubs"  # nothing of an earlier pack may shadow a stand-in
install() {
    local target=$1; shift
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$target" \
        "$@" 2>&1 | grep -v WARN | tee -a "$log"
}
install "$site" "$pack"/wheels/*.whl "$pack"/qdc/*.whl
if wanted quadrants; then
    if ls "$pack"/quadrants/*.whl > /dev/null 2>&1; then
        install "$quadrants_site" "$pack"/quadrants/*.whl
    else
        say "error: no $pack/quadrants/*.whl (tools/device/genesis_pack.sh): no quadrants runs"; runs=${runs/quadrants}
    fi
fi
for name in av z3 zstandard DracoPy coacd OpenEXR Imath; do
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
qdc_path="/tmp/genesis-pp:$site:$stubs" quadrants_path="$quadrants_site:$site:$stubs"
export PYTHONPATH="$qdc_path" PYTHONUNBUFFERED=1
# Genesis's viewer subclasses a pyglet window at import; without X11's libraries (a GPU host's
# image has none) only pyglet's headless mode (EGL, from .gl/) imports.
ldconfig -p 2> /dev/null | grep -q libXrender.so || export PYGLET_HEADLESS=True
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
if wanted quadrants; then
    PYTHONPATH="$quadrants_path" "$py" -c '
import importlib.metadata, quadrants, genesis
version = importlib.metadata.version("quadrants")
print(f"quadrants {version} from {quadrants.__file__}")' 2>&1 | tee -a "$log"
    if [ "${PIPESTATUS[0]}" != 0 ]; then
        say "error: Quadrants cannot be imported with Genesis (above): no quadrants runs"; runs=${runs/quadrants}
    fi
fi

# run LABEL SCENE CACHE LIMIT ARGS...: one bench/genesis_scene.py process of at most LIMIT seconds,
# with the kernel cache (qdc's or Quadrants') in CACHE and Genesis's own (meshes, convex hulls) in
# CACHE/genesis or $genesis_cache; its JSON line, labelled, goes to results.jsonl (without one, its
# exit status does), the rest of its output to $runlog
runlog=$log
run() {
    local label=$1 scene=$2 cache=$3 limit=$4; shift 4
    local left=$(( deadline - $(date +%s) ))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 20 ]; then echo "skipped $label $scene: out of time" | tee -a "$runlog"; return 1; fi
    echo "== $label $scene ($*), at most ${limit}s" | tee -a "$runlog"
    local t0 printed line rc
    t0=$(date +%s%N) printed=$(mktemp)
    GS_CACHE_FILE_PATH="${genesis_cache:-$cache/genesis}" QDC_CACHE_DIR="$cache" QD_OFFLINE_CACHE_FILE_PATH="$cache" \
        timeout "$limit" "$py" bench/genesis_scene.py "$scene" 100 "$@" $GENESIS_SCENE_ARGS > "$printed" 2>> "$runlog"
    rc=$?
    cat "$printed" >> "$runlog"
    echo "   $label $scene: exit $rc after $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$runlog"
    line=$(grep '^{' "$printed" | tail -1)
    [ -n "$line" ] || line="null, \"exit\": $rc"
    echo "{\"label\": \"$label\", \"scene\": \"$scene\", \"result\": $line}" >> "$results"
    rm -f "$printed"
    return $rc
}

# qdc on the GPU backend: cold, recording the manifest that the prebuilt run builds, then warm
qdc_runs() {
    local scene=$1
    rm -rf "/tmp/gq-qdc-$scene" "$out/$scene.manifest"
    QDC_RECORD="$out/$scene.manifest" run qdc-cold "$scene" "/tmp/gq-qdc-$scene" 200 --qdc --backend "$gpu"
    run qdc-warm "$scene" "/tmp/gq-qdc-$scene" 60 --qdc --backend "$gpu"
}

# Quadrants on the GPU backend: `import quadrants` is Quadrants (no --qdc), cold then warm
quadrants_runs() {
    local scene=$1
    rm -rf "/tmp/gq-quadrants-$scene"
    PYTHONPATH="$quadrants_path" run quadrants-cold "$scene" "/tmp/gq-quadrants-$scene" 240 --backend "$gpu"
    PYTHONPATH="$quadrants_path" run quadrants-warm "$scene" "/tmp/gq-quadrants-$scene" 60 --backend "$gpu"
}

# The cold run's manifest built by `qdc build --manifest` in a process of its own (timed: a line of
# results.jsonl), then a process that may only load: QDC_OFFLINE=1 makes a missing kernel an error
prebuilt_runs() {
    local scene=$1
    local cache=/tmp/gq-prebuilt-$scene manifest=$out/$scene.manifest
    if [ ! -s "$manifest" ]; then
        echo "skipped prebuilt $scene: no manifest (the qdc cold run records it)" | tee -a "$log"; return
    fi
    local limit=$(( deadline - $(date +%s) ))
    [ "$limit" -gt 150 ] && limit=150
    if [ "$limit" -lt 20 ]; then echo "skipped prebuilt $scene: out of time" | tee -a "$log"; return; fi
    rm -rf "$cache"
    echo "== qdc build --manifest $scene.manifest --arch $gpu, at most ${limit}s" | tee -a "$log"
    local t0 built rc ms summary
    t0=$(date +%s%N) built=$(mktemp)
    timeout "$limit" "$py" -m qdc.cli.main build --manifest "$manifest" --arch "$gpu" --cache "$cache" \
        -j "$(nproc)" > "$built" 2>&1
    rc=$? ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    tee -a "$log" < "$built"
    summary=$(grep '^qdc build:' "$built" | tail -1 | sed 's/\\/\\\\/g; s/"/\\"/g')
    rm -f "$built"
    echo "   qdc build --manifest $scene: exit $rc after $ms ms" | tee -a "$log"
    echo "{\"label\": \"qdc-build-manifest\", \"scene\": \"$scene\"," \
         "\"manifest_build\": {\"exit\": $rc, \"ms\": $ms, \"summary\": \"$summary\"}}" >> "$results"
    [ "$rc" = 0 ] || return
    genesis_cache="/tmp/gq-qdc-$scene/genesis" QDC_OFFLINE=1 \
        run qdc-prebuilt "$scene" "$cache" 60 --qdc --backend "$gpu"
}

vulkan_runs() {
    local scene=$1
    rm -rf "/tmp/gq-vulkan-$scene"
    run vulkan-cold "$scene" "/tmp/gq-vulkan-$scene" 200 --qdc --backend cuda --arch vulkan --torch-cpu
}

# The CPU reference runs beside the GPU runs (its own process and log: a host of many cores; the GPU
# timings are of processes that had a core each), the GPU runs one after another.
reference=""
if wanted cpu; then
    (runlog="$out/genesis-cpu.log"
     for scene in $scenes; do
         rm -rf "/tmp/gq-cpu-$scene"; run cpu-reference $scene "/tmp/gq-cpu-$scene" 300 --qdc --backend cpu
     done) &
    reference=$!
fi
for what in $runs; do
    [ "$what" = cpu ] && continue
    for scene in $scenes; do "${what}_runs" $scene; done
done
[ -n "$reference" ] && wait "$reference"
say "done at $(date -u '+%H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"

"$py" tools/device/genesis_summary.py "$results" "$log" 2>&1 | tee "$out/summary.txt" | tee -a "$log"
