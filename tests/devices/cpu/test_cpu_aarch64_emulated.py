"""aarch64 deployments, emulated: kernels this x86-64 (or any) machine builds with
`cpu_targets` x86_64,aarch64-linux run under qemu-aarch64 in an aarch64 CPython (Debian's
arm64 packages: tools/cross/aarch64-sysroot.sh, which `make test` runs into .cross/aarch64)
with numpy, msgpack and the qdc-runtime wheel only, once per ISA level the runtime picks by
the emulated CPU's features (cortex-a57: armv8-a, neoverse-n1: armv8.2-a, max: SVE), against
numpy: forward and gradient kernels, dynamic loops and adstacks, the width-W lowering of each
level (1-D and 2-D ranges, gathers, masked lanes, f32 and f64); and, against the same script's
run on the build host, kernels/diffmpm.py's forward and backward passes and kernels of f16,
integer arithmetic, atomics on computed addresses, random draws and early loop exits. A module
built for x86_64 alone is refused there with ModuleNotBuiltError."""
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from conftest import REPO_ROOT
from runtime_wheel_util import build_runtime_wheel
from qdc.compiler.commands import build as build_mod
from qdc.compiler.driver.options import resolve
from qdc.compiler.targets import lld
from qdc.runtime.cache import Cache, read_module

QEMU = shutil.which("qemu-aarch64")
SYSROOT = os.environ.get("QDC_AARCH64_SYSROOT") or os.path.join(REPO_ROOT, ".cross", "aarch64", "root")
# qemu CPU -> the level whose library the runtime must choose there
CPUS = {"cortex-a57": "armv8-a", "neoverse-n1": "armv8.2-a", "max": "armv8.2-a+sve"}


def _why_not_runnable() -> str | None:
    if QEMU is None:
        return "qemu-aarch64 is not installed (apt-get install qemu-user; `make test` installs it)"
    if not os.path.isfile(os.path.join(SYSROOT, ".complete")):
        return (f"no aarch64 sysroot at {SYSROOT} (`make test` makes it with tools/cross/aarch64-sysroot.sh, "
                f"which needs apt-get and the network; or set QDC_AARCH64_SYSROOT)")
    if not lld.find("ld.lld"):
        return f"no ld.lld {lld.MIN_LLD}+ to link aarch64 libraries ({lld.INSTALL_HINT})"
    return None


pytestmark = pytest.mark.skipif(_why_not_runnable() is not None, reason=str(_why_not_runnable()))

KERNELS = '''
import qdc as qd

steps = qd.field(qd.i32, shape=())
x, loss = qd.field(qd.f32, shape=96, needs_grad=True), qd.field(qd.f32, shape=(), needs_grad=True)
d, dloss = qd.field(qd.f64, shape=40, needs_grad=True), qd.field(qd.f64, shape=(), needs_grad=True)


@qd.kernel
def chain():
    """A dynamic inner loop: W iterations in lanes; its gradient replays it from adstacks."""
    for i in x:
        v, t = x[i], 0.0
        for _ in range(steps[None]):
            v = qd.sin(v + t) * 0.9
            t += 0.01
        loss[None] += v * v


@qd.kernel
def chain64():
    for i in d:
        v = d[i]
        for _ in range(steps[None]):
            v = qd.tanh(v) * 0.8 + v * v * 0.1
        dloss[None] += v * qd.exp(-v)


@qd.kernel
def escape(img: qd.types.ndarray(dtype=qd.i32, ndim=2), iters: qd.i32):
    """2-D range, lanes that leave the loop at different trips (masked)."""
    for i, j in qd.ndrange(img.shape[0], img.shape[1]):
        cr = -2.0 + 2.5 * i / img.shape[0]
        ci = -1.25 + 2.5 * j / img.shape[1]
        zr, zi = 0.0, 0.0
        count = 0
        for _ in range(iters):
            if zr * zr + zi * zi < 4.0:
                zr, zi = zr * zr - zi * zi + cr, 2.0 * zr * zi + ci
                count += 1
        img[i, j] = count


@qd.kernel
def gather(table: qd.types.ndarray(dtype=qd.f32, ndim=1), idx: qd.types.ndarray(dtype=qd.i32, ndim=1),
           out: qd.types.ndarray(dtype=qd.f32, ndim=1), taps: qd.i32):
    for i in range(out.shape[0]):
        acc = 0.0
        for k in range(taps):
            acc += table[(idx[i] + k * 7) % table.shape[0]] * (k + 1)
        out[i] = acc


@qd.kernel
def axpy(a: qd.f32, u: qd.types.ndarray(dtype=qd.f32, ndim=1), w: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(u.shape[0]):
        w[i] = a * u[i] + w[i]


# Checked against the build host's run of the same script (the CPU backend as the reference).
h, f, k, b8, drawn = (qd.field(dtype, shape=300) for dtype in (qd.f16, qd.f32, qd.i32, qd.u8, qd.f64))
hist, lowest, highest = qd.field(qd.i32, shape=16), qd.field(qd.f32, shape=8), qd.field(qd.i64, shape=8)


@qd.kernel
def halves():
    for i in range(300):
        v = qd.cast(h[i], qd.f32)
        for _ in range(steps[None]):
            v = v * 0.75 + 0.5
        h[i] = qd.cast(v, qd.f16)


@qd.kernel
def integers():
    for i in range(300):
        a, c = k[i], 0
        for j in range(steps[None]):
            c += (a + j) // 3 - (a - j) % 5 + (a ^ j) - (a >> 2)
        k[i] = c
        b8[i] = qd.cast(c & 255, qd.u8) + b8[i]


@qd.kernel
def scatter():
    for i in range(300):
        cell = (k[i] * 7 + i) % 16
        qd.atomic_add(hist[cell], 1)
        qd.atomic_min(lowest[cell % 8], f[i])
        qd.atomic_max(highest[cell % 8], qd.cast(k[i], qd.i64) * 3)


@qd.kernel
def draws():
    for i in range(300):
        acc = 0.0
        for _ in range(steps[None]):
            acc += qd.random(qd.f32)
        drawn[i] = acc + qd.random(qd.f64)


@qd.kernel
def early_exit():
    for i in range(300):
        v, n = f[i], 0
        while v > 0.01 and n < 100:
            v = v * qd.cos(v) * 0.9
            n += 1
            if n == steps[None] + i % 7:
                break
        f[i] = v + n
'''

# Built for x86_64 alone: an aarch64 host refuses it.
X86_ONLY = '''
import qdc as qd

marks = qd.field(qd.f32, shape=4)


@qd.kernel
def mark():
    for i in marks:
        marks[i] = 1.0
'''

# Runs in the emulated aarch64 CPython: argv = cache, inputs .npz, outputs .npz, x86_64-only cache.
DEPLOY = '''
import sys

import numpy as np

from qdc.runtime import ModuleNotBuiltError, load
from qdc.runtime.devices.cpu import device

cache, inputs, outputs, x86_only = sys.argv[1:5]
try:
    load(x86_only, "x86only")
except ModuleNotBuiltError as e:
    print("not built:", e)
data = dict(np.load(inputs))
mod = load(cache, "emulated")
out = {}
mod.steps[None] = int(data["steps"])
mod.x.from_numpy(data["x"])
mod.chain()
mod.loss.grad[None] = 1.0
mod.chain.grad()
out["loss"], out["x_grad"] = np.float32(mod.loss[None]), mod.x.grad.to_numpy()
mod.d.from_numpy(data["d"])
mod.chain64()
mod.dloss.grad[None] = 1.0
mod.chain64.grad()
out["dloss"], out["d_grad"] = np.float64(mod.dloss[None]), mod.d.grad.to_numpy()
out["img"] = np.zeros((37, 29), np.int32)
mod.escape(out["img"], int(data["iters"]))
out["gathered"] = np.zeros(data["idx"].size, np.float32)
mod.gather(data["table"], data["idx"], out["gathered"], int(data["taps"]))
out["w"] = data["w"].copy()
mod.axpy(float(data["a"]), data["u"], out["w"])
mod.h.from_numpy(data["h"])
mod.f.from_numpy(data["f"])
mod.k.from_numpy(data["k"])
mod.b8.from_numpy(data["b8"])
mod.lowest.from_numpy(np.full(8, 100, np.float32))
mod.halves()
mod.integers()
mod.scatter()
mod.draws()
mod.early_exit()
for name in ("h", "f", "k", "b8", "drawn", "hist", "lowest", "highest"):
    out["same_" + name] = getattr(mod, name).to_numpy()
mpm = load(cache, "diffmpm")  # kernels/diffmpm.py, its backward pass replayed as a Tape would
steps = mpm.x.shape[0] - 1
mpm.init_particles()
velocity = mpm.v.to_numpy()
velocity[0] = data["v0"]
mpm.v.from_numpy(velocity)
mpm.clear_grid()
substeps = (mpm.p2g, mpm.grid_op, mpm.g2p)
for s in range(steps):
    for kernel in substeps:
        kernel(s)
mpm.compute_loss()
mpm.loss.grad[None] = 1.0
mpm.compute_loss.grad()
for s in reversed(range(steps)):
    for kernel in reversed(substeps):
        kernel.grad(s)
out["mpm_loss"], out["mpm_grad"] = np.float32(mpm.loss[None]), mpm.v.grad.to_numpy()[0]
np.savez(outputs, **out)
levels = {device.select_library(k._entry.meta.cpu_libraries, name)["target"] for name, k in mod._kernels.items()}
print("levels", ",".join(sorted(levels)))
print("compiler modules", sorted(m for m in sys.modules if m.split(".")[0] in ("llvmlite", "click", "yaml")
                                 or m.startswith(("qdc.compiler", "qdc.cli"))))
'''


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """(the runtime-only install, the built cache): the qdc-runtime wheel unpacked as pip
    would install it (pure Python), and the module built for x86_64 and aarch64 Linux."""
    out = tmp_path_factory.mktemp("aarch64")
    wheel = build_runtime_wheel(out)
    site = out / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    (out / "emulated.py").write_text(KERNELS, encoding="utf-8")
    cache = str(out / "cache")
    sources = [str(out / "emulated.py"), os.path.join(REPO_ROOT, "kernels", "diffmpm.py")]
    report = build_mod.build(sources, ["cpu"], resolve({"cpu_targets": "x86_64,aarch64-linux"}, {}), cache, jobs=1,
                             log=lambda text: None)
    assert report.ok, report.errors
    (out / "x86only.py").write_text(X86_ONLY, encoding="utf-8")
    report = build_mod.build([str(out / "x86only.py")], ["cpu"], resolve({"cpu_targets": "x86_64"}, {}),
                             str(out / "x86only"), jobs=1, log=lambda text: None)
    assert report.ok, report.errors
    (out / "deploy.py").write_text(DEPLOY, encoding="utf-8")
    return out, str(site), cache


def _inputs(rng) -> dict:
    return {"steps": 23, "x": rng.uniform(-2, 2, 96).astype(np.float32), "d": rng.uniform(-1.5, 1.5, 40),
            "iters": 40, "table": rng.standard_normal(300).astype(np.float32),
            "idx": rng.integers(0, 300, 203).astype(np.int32), "taps": 9, "a": np.float32(rng.uniform(-2, 2)),
            "u": rng.standard_normal(1031).astype(np.float32), "w": rng.standard_normal(1031).astype(np.float32),
            "v0": rng.uniform(-1, 1, (64, 2)).astype(np.float32), "h": rng.uniform(-3, 3, 300).astype(np.float16),
            "f": rng.uniform(0.1, 3, 300).astype(np.float32), "k": rng.integers(-1000, 1000, 300).astype(np.int32),
            "b8": rng.integers(0, 255, 300).astype(np.uint8)}


def _expected(data: dict) -> dict:
    """numpy, in float64: the forward values and the analytic gradients of the chains."""
    x = data["x"].astype(np.float64)
    v, dv = x.copy(), np.ones_like(x)
    for k in range(data["steps"]):
        t = np.float32(0.01) * k  # accumulated in f32 by the kernel; 23 steps stay exact enough
        v, dv = np.sin(v + t) * 0.9, dv * 0.9 * np.cos(v + t)
    d = data["d"].copy()
    w, dw = d.copy(), np.ones_like(d)
    for _ in range(data["steps"]):
        w, dw = np.tanh(w) * 0.8 + w * w * 0.1, dw * ((1 - np.tanh(w) ** 2) * 0.8 + 0.2 * w)
    i, j = np.meshgrid(np.arange(37), np.arange(29), indexing="ij")
    c = (-2.0 + 2.5 * i / 37) + 1j * (-1.25 + 2.5 * j / 29)
    z, count = np.zeros_like(c), np.zeros(c.shape, np.int32)
    for _ in range(data["iters"]):
        inside = np.abs(z) ** 2 < 4.0
        z = np.where(inside, z * z + c, z)
        count += inside
    taps = np.arange(data["taps"])
    gathered = (data["table"][(data["idx"][:, None] + taps * 7) % 300].astype(np.float64) * (taps + 1)).sum(1)
    return {"loss": (v * v).sum(), "x_grad": 2 * v * dv, "dloss": (w * np.exp(-w)).sum(), "d_grad": dw * (1 - w) * np.exp(-w),
            "img": count, "gathered": gathered, "w": data["a"] * data["u"] + data["w"]}


def _check(got: dict, want: dict) -> None:
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-4)
    np.testing.assert_allclose(got["x_grad"], want["x_grad"], rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(got["dloss"], want["dloss"], rtol=1e-10)
    np.testing.assert_allclose(got["d_grad"], want["d_grad"], rtol=1e-9, atol=1e-12)
    # f32 arithmetic near the escape radius may take one trip more or less than float64's
    assert np.mean(got["img"] != want["img"]) < 0.02 and np.abs(got["img"] - want["img"]).max() <= 40
    np.testing.assert_allclose(got["gathered"], want["gathered"], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got["w"], want["w"], rtol=1e-6, atol=1e-6)


def test_the_build_is_widened(deployment):
    """The tasks checked below run W iterations in lanes (the width-W lowering)."""
    _, _, cache = deployment
    store = Cache(cache)
    kernels = read_module(store, "emulated", "cpu")["kernels"]
    for name in ("chain", "chain64", "escape", "gather"):
        assert store.lookup(kernels[name]).meta.tasks[-1].launch.get("lanes", 1) > 1, name


def _deploy(out, site, cache, cpu: str | None) -> subprocess.Popen:
    """The deployment script on the runtime-only install: under qemu-aarch64 -cpu `cpu`, or
    (None) natively with this interpreter, whose x86-64 results are DiffMPM's reference."""
    env = {**os.environ, "PYTHONPATH": site, "PYTHONNOUSERSITE": "1", "QEMU_LD_PREFIX": SYSROOT}
    env.pop("PYTHONHOME", None)
    python = [sys.executable] if cpu is None else [QEMU, "-cpu", cpu, os.path.join(SYSROOT, "usr", "bin", "python3")]
    arguments = [cache, str(out / "inputs.npz"), str(out / f"out-{cpu or 'host'}.npz"), str(out / "x86only")]
    return subprocess.Popen(python + ["-s", str(out / "deploy.py"), *arguments], env=env, cwd=str(out),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_every_aarch64_level_under_qemu(deployment, rng):
    out, site, cache = deployment
    data = _inputs(rng)
    np.savez(out / "inputs.npz", **data)
    want = _expected(data)
    runs = {cpu: _deploy(out, site, cache, cpu) for cpu in [None, *CPUS]}
    text = runs[None].communicate(timeout=600)[0]
    assert runs[None].returncode == 0, text
    host = dict(np.load(out / "out-host.npz"))
    assert np.abs(host["mpm_grad"]).min() > 1e-5  # about steps * dt / particles: the backward pass ran
    for cpu, level in CPUS.items():
        text = runs[cpu].communicate(timeout=600)[0]
        assert runs[cpu].returncode == 0, f"{cpu}:\n{text}"
        assert f"levels {level}\n" in text and "compiler modules []" in text, f"{cpu}:\n{text}"
        assert ("not built: kernel 'mark' was built for the CPU targets x86_64-linux, but this host is "
                "aarch64-linux: build it for this host too with `qdc build --cpu-targets aarch64") in text, text
        got = dict(np.load(out / f"out-{cpu}.npz"))
        try:
            _check(got, want)
            for name in (n for n in host if n.startswith("same_")):  # f16, integer, atomic, random: the same
                np.testing.assert_allclose(got[name], host[name], rtol=1e-6, err_msg=name)
            np.testing.assert_allclose(got["mpm_loss"], host["mpm_loss"], rtol=1e-5)
            np.testing.assert_allclose(got["mpm_grad"], host["mpm_grad"], rtol=1e-3, atol=1e-9)
        except AssertionError as e:
            raise AssertionError(f"under qemu-aarch64 -cpu {cpu} ({level}): {e}") from None
