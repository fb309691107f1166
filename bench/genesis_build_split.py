"""Where a Genesis scene's `scene.build()` spends its time: the kernel framework's part (qdc's
cache keys, entries, launchers, fields; Quadrants' likewise) and Genesis's own Python work
(trimesh, numba, its solvers' setup), which any framework pays. Prints one JSON line.

    python bench/genesis_build_split.py {box,franka} [--qdc] [--profile | --sample]

Without --profile: `scene.build()` timed alone, the cycle collector's pauses during it, and (with
--qdc) the seconds of qdc's first launches, split into computing cache keys, reading entries,
loading libraries and making launchers (wrapped timers, no profiler). With --profile: the same
build under cProfile, its time split by the package whose code ran; time in numpy, the standard
library and C functions is given to the package that called them (by how long each caller spent
in them), so that "genesis" is Genesis's own work whatever it calls, and "framework" is qdc's or
Quadrants' Python code and the kernels it runs. Profiling slows Python code more than numpy's,
so read the profiled split as shares, and the unprofiled run for seconds. With --sample: no
profiler; a thread looks at the main thread's stack every millisecond and gives the time since
its last look to the package of the innermost frame that has one (as above: numpy, the standard
library and C code count for their caller), which splits the unprofiled seconds. In both, the
framework's part is split further by what its code does (cache keys, reading entries, ...).
With --qdc, QDC_OFFLINE=1 and QDC_CACHE_DIR select the offline process and its cache.
"""
import collections
import cProfile
import gc
import json
import pstats
import sys
import threading
import time

scene_name = sys.argv[1]
use_qdc, profile, sample = "--qdc" in sys.argv, "--profile" in sys.argv, "--sample" in sys.argv
phases = collections.defaultdict(float)


def timed(owner, name, label):
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            phases[label] += time.perf_counter() - t
    setattr(owner, name, wrapper)


compiled = []
if use_qdc:
    import qdc
    qdc.install_as_quadrants()
    from qdc.compiler.driver import cache_key, kernel as compiling
    from qdc.compiler.jit import kernel as jit_kernel, offline_cache
    from qdc.runtime.devices.cpu import device as cpu_device
    _compile = compiling.compile_kernel
    compiling.compile_kernel = lambda fn, *a, **k: compiled.append(fn.__name__) or _compile(fn, *a, **k)
    if not (profile or sample):
        timed(jit_kernel.Kernel, "_launcher", "first launches (all below)")
        timed(cache_key, "kernel_key", "cache keys")
        timed(offline_cache, "load_cached", "reading entries")
        timed(jit_kernel, "make_launcher", "making launchers")
        timed(cpu_device.CpuDevice, "load_kernel", "loading libraries")
import genesis as gs  # noqa: E402
import numpy as np  # noqa: E402

gs.init(backend=gs.cpu, precision="32", logging_level="warning", seed=0)
scene = gs.Scene(show_viewer=False)
scene.add_entity(gs.morphs.Plane())
if scene_name == "box":
    scene.add_entity(gs.morphs.Box(pos=(0.0, 0.0, 0.5), size=(0.2, 0.2, 0.2)))
else:
    scene.add_entity(gs.morphs.MJCF(file="xml/franka_emika_panda/panda.xml"))

# ---- who owns the code running -------------------------------------------------------------
OWNERS = (("/qdc/", "framework"), ("/quadrants/", "framework"), ("<qdc", "framework"), ("/genesis/", "genesis"),
          ("/trimesh/", "genesis: trimesh"), ("/numba/", "genesis: numba"), ("/llvmlite/", "genesis: numba"),
          ("/OpenGL/", "genesis: visualiser"), ("/pyrender/", "genesis: visualiser"), ("/scipy/", "genesis: scipy"),
          ("/torch/", "torch"))


def package(func):
    """The package whose code `func` is, None where its time goes to its callers."""
    filename = func[0]
    for marker, name in OWNERS:
        if marker in filename:
            return name
    if filename == "~" or filename.startswith("<") or "/numpy/" in filename or "site-packages" not in filename:
        return None  # C functions, numpy and the standard library: their callers'
    return "other packages"


GROUPS = (("compiler/driver/cache_key", "cache keys"), ("compiler/driver/sources", "cache keys"),
          ("compiler/driver/source_facts", "cache keys"), ("runtime/contract/source_records", "cache keys"),
          ("compiler/driver/template_values", "cache keys"), ("compiler/language/dataclass_args", "cache keys"),
          ("compiler/driver/templates", "cache keys"), ("compiler/jit/offline_cache", "cache keys"),
          ("runtime/cache", "reading entries"), ("runtime/contract/artifact", "reading entries"),
          ("runtime/contract/entry_points", "reading entries"), ("runtime/devices", "loading libraries, allocating"),
          ("runtime/launcher", "launchers, launching"), ("runtime/member_arguments", "launchers, launching"),
          ("compiler/jit/variant_dispatch", "launchers, launching"), ("compiler/jit/kernel", "launchers, launching"),
          ("runtime/kernel_function", "launchers, launching"), ("<qdc launcher", "launchers, launching"),
          ("runtime/fields", "fields, ndarrays, Python-scope access"),
          ("runtime/tensors", "fields, ndarrays, Python-scope access"),
          ("runtime/lifecycle", "fields, ndarrays, Python-scope access"),
          ("runtime/torch_conversions", "fields, ndarrays, Python-scope access"),
          ("runtime/contract/sizeexpr", "launchers, launching"), ("__init__", "qd.NAME look-ups"),
          ("runtime/contract/arches", "qd.NAME look-ups"))


def owner_and_group(func, by_group: bool):
    """package(func), with qdc's code split by GROUPS where `by_group`."""
    name = package(func)
    if name == "framework" and by_group and "qdc" in func[0]:
        where = func[0].split("/qdc/")[-1]
        return "qdc: " + next((g for prefix, g in GROUPS if where.startswith(prefix)), "other")
    return name


pauses = []


def on_collection(phase, info, started=[0.0]):
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        pauses.append((info["generation"], time.perf_counter() - started[0]))


class Sampler(threading.Thread):
    """Every `interval` s, the time since the last look goes to the innermost frame of the main
    thread that `owner` names."""

    def __init__(self, owner, interval=0.001):
        super().__init__(daemon=True)
        self.owner, self.interval, self.seconds = owner, interval, collections.Counter()
        self.main, self.running = threading.main_thread().ident, True

    def run(self):
        last = time.perf_counter()
        while self.running:
            time.sleep(self.interval)
            frame, now = sys._current_frames().get(self.main), time.perf_counter()
            while frame is not None:
                code = frame.f_code
                name = self.owner((code.co_filename, code.co_firstlineno, code.co_name))
                if name is not None:
                    self.seconds[name] += now - last
                    break
                frame = frame.f_back
            last = now


profiler, sampler = cProfile.Profile(), None
gc.callbacks.append(on_collection)
if sample:
    sampler = Sampler(lambda func: owner_and_group(func, by_group=True))
    sys.setswitchinterval(0.001)  # the sampler gets the interpreter's lock within a millisecond
    sampler.start()
t0 = time.perf_counter()
if profile:
    profiler.enable()
scene.build()
profiler.disable()
t_build = time.perf_counter() - t0
if sampler is not None:
    sampler.running = False
    sampler.join()
gc.callbacks.remove(on_collection)
out = {"scene": scene_name, "framework": "qdc" if use_qdc else "quadrants", "build": round(t_build, 3),
       "compiles": len(compiled) if use_qdc else None,
       "collector": {f"gen{g}": [sum(1 for gen, _ in pauses if gen == g), round(sum(d for gen, d in pauses if gen == g), 3)]
                     for g in (0, 1, 2)}}  # [collections, seconds]
if not (profile or sample) and use_qdc:
    out["qdc"] = {k: round(v, 3) for k, v in phases.items()}

# ---- the profiled split ----------------------------------------------------------------------

def split(stats: dict) -> dict:
    memo = {}

    def owners(func, seen):
        if func in memo:
            return memo[func]
        name = owner_and_group(func, by_group=True)
        if name is not None:
            return {name: 1.0}
        callers = stats[func][4]
        total = sum(v[2] for c, v in callers.items() if c not in seen) or 1.0
        shares = collections.Counter()
        for caller, v in callers.items():
            if caller not in seen:
                for owner, w in owners(caller, seen | {func}).items():
                    shares[owner] += w * v[2] / total
        result = dict(shares) or {"unattributed": 1.0}
        if not seen:
            memo[func] = result
        return result

    seconds = collections.Counter()
    for func, (_, _, tottime, _, _) in stats.items():
        for owner, w in owners(func, frozenset()).items():
            seconds[owner] += tottime * w
    return {k: round(v, 3) for k, v in seconds.most_common()}


if profile:
    out["profiled_split"] = split(pstats.Stats(profiler).stats)
if sampler is not None:
    out["sampled_split"] = {k: round(v, 3) for k, v in sampler.seconds.most_common()}
print(json.dumps(out))
