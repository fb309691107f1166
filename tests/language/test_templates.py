"""`qd.template()` / `qd.Template` parameters (docs/api.md, Writing kernels): fields and compile-time values.

A template argument is a field (the kernel is compiled per distinct field declaration and
bound to the field passed) or a Python value (a compile-time constant). Each enters the cache
key by what it is; a cache hit between two instantiations that differ would be the worst bug,
so the key and the results are checked for every kind of difference.
"""
from __future__ import annotations

import enum

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import cache_key
from qdc.compiler.jit.api import direct_options
from qdc.compiler.jit.kernel import kernel_of
from qdc.compiler.driver.templates import TemplateParams


def _key(k, **templates):
    kernel = kernel_of(k)
    bound = kernel.template_params.bind(templates)
    return cache_key.kernel_key(kernel.fn, kernel.params, direct_options(), "cpu", "forward", bound).key


def test_a_field_template_binds_the_field_passed(arch, rng):
    a = qd.field(qd.f32, shape=32)
    b = qd.field(qd.f32, shape=32)  # same declaration but its name: same code, other memory
    c = qd.field(qd.f32, shape=20)
    d = qd.field(qd.f64, shape=7)

    @qd.kernel
    def scale_all(x: qd.Template, s: qd.f32):
        for I in x:
            x[I] = x[I] * s

    data = {f: rng.random(f.shape).astype(f.dtype.np_dtype) for f in (a, b, c, d)}
    for f, v in data.items():
        f.from_numpy(v)
    scale_all(a, 2.0)
    scale_all(b, 3.0)
    scale_all(c, 4.0)
    scale_all(d, 0.5)
    for f, s in ((a, 2.0), (b, 3.0), (c, 4.0), (d, 0.5)):
        np.testing.assert_allclose(f.to_numpy(), data[f] * s, rtol=1e-6)
    kernel = kernel_of(scale_all)
    compiled = {id(entry[2]): entry[2] for entry in kernel._launchers.values()}
    assert len(compiled) == 4  # one variant per field
    assert sorted(f.dtype for c in compiled.values() for f in c.meta.fields) == ["f32", "f32", "f32", "f64"]
    assert sorted(tuple(f.shape) for c in compiled.values() for f in c.meta.fields) == [(7,), (20,), (32,), (32,)]


def test_value_templates_are_compile_time_constants(arch, rng):
    out = qd.field(qd.f32, shape=16)

    @qd.kernel
    def fill(n: qd.template(), scale: qd.template(), twice: qd.template(), offsets: qd.template()):
        for i in range(n):  # a constant trip count
            v = i * scale
            if qd.static(twice):
                v = v * 2
            for k in qd.static(range(len(offsets))):
                v += offsets[k]
            out[i] = v

    for n, scale, twice, offsets in ((16, 0.5, False, (1.0,)), (8, 2.0, True, (1.0, 2.0, 3.0)),
                                     (16, 0.5, True, ()), (4, float(rng.random()), False, (0.25, 0.5))):
        out.fill(-1)
        fill(n, scale, twice, offsets)
        want = np.full(16, -1.0, np.float32)
        i = np.arange(n)
        want[:n] = i * scale * (2 if twice else 1) + sum(offsets)
        np.testing.assert_allclose(out.to_numpy(), want, rtol=1e-6)


def test_templates_by_keyword_and_mixed_with_ndarrays(arch, rng):
    acc = qd.field(qd.f32, shape=())

    @qd.kernel
    def dot(a: qd.types.ndarray(dtype=qd.f32, ndim=1), w: qd.template(), b: qd.types.ndarray(), k: qd.i32):
        for i in range(a.shape[0]):
            acc[None] += a[i] * b[i] * w + k

    a, b = rng.random(64).astype(np.float32), rng.random(64).astype(np.float32)
    acc[None] = 0
    dot(a, 2.0, b, 1)
    np.testing.assert_allclose(acc[None], float((a * b * 2.0 + 1).sum()), rtol=1e-5)
    acc[None] = 0
    dot(a, w=3.0, b=b.astype(np.float32), k=0)
    np.testing.assert_allclose(acc[None], float((a * b * 3.0).sum()), rtol=1e-5)


def test_funcs_take_template_fields(arch, rng):
    p = qd.field(qd.f32, shape=10)
    q = qd.field(qd.f32, shape=10)

    @qd.func
    def add_to(dst: qd.template(), src: qd.template(), i):
        dst[i] += src[i]

    @qd.kernel
    def run(x: qd.template(), y: qd.template()):
        for i in x:
            add_to(x, y, i)

    vp, vq = rng.random(10).astype(np.float32), rng.random(10).astype(np.float32)
    p.from_numpy(vp)
    q.from_numpy(vq)
    run(p, q)
    np.testing.assert_allclose(p.to_numpy(), vp + vq, rtol=1e-6)
    run(q, p)
    np.testing.assert_allclose(q.to_numpy(), vq + vp + vq, rtol=1e-6)


def test_cache_key_tells_every_template_argument_apart():
    a = qd.field(qd.f32, shape=8, name="a")
    b = qd.field(qd.f32, shape=8, name="b")
    a2 = qd.field(qd.f32, shape=8, name="a")  # the same declaration as a
    c = qd.field(qd.f32, shape=9, name="a")
    d = qd.field(qd.f64, shape=8, name="a")
    e = qd.field(qd.f32, shape=8, name="a", needs_grad=True)

    @qd.kernel
    def k(x: qd.template(), v: qd.template()):
        for i in x:
            x[i] = v

    keys = {name: _key(k, x=f, v=1) for name, f in (("a", a), ("b", b), ("c", c), ("d", d), ("e", e))}
    assert len(set(keys.values())) == 5
    assert _key(k, x=a2, v=1) == keys["a"]  # same declaration: one entry, bound to each field at load
    values = [1, 2, True, 1.0, -1, "1", (1,), (1, 2), [1, 2], None, np.float32(1), np.int64(1), qd.f32, qd.i32]
    value_keys = [_key(k, x=a, v=v) for v in values]
    assert len(set(value_keys)) == len(values), values
    assert _key(k, x=a, v=(1, 2)) == value_keys[7]  # and stable


PUT_SCRIPT = """
import sys
import numpy as np
import qdc as qd
qd.init(arch=qd.cpu, cache_dir=sys.argv[1])
x = qd.field(qd.i32, shape=4, name="tpl_x")
y = qd.field(qd.i32, shape=4, name="tpl_y")

@qd.kernel
def put(f: qd.template(), v: qd.template()):
    for i in f:
        f[i] = v * 10 + i

for name, v in zip(sys.argv[2::2], sys.argv[3::2]):
    f = {"x": x, "y": y}[name]
    put(f, int(v))
    assert list(f.to_numpy()) == [int(v) * 10 + i for i in range(4)], (name, v, f.to_numpy())
print("OK")
"""


def test_no_wrong_cache_hit_across_processes(tmp_path):
    """A second process finds the first one's entries: each template argument still gets its own."""
    import subprocess
    import sys
    script = tmp_path / "put.py"
    script.write_text(PUT_SCRIPT, encoding="utf-8")
    cache = str(tmp_path / "cache")
    for order in (["x", "3", "y", "3", "x", "7"], ["x", "7", "y", "7", "x", "3", "y", "-2", "x", "5"]):
        r = subprocess.run([sys.executable, str(script), cache, *order], capture_output=True, text=True)
        assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


def test_no_wrong_cache_hit_across_runtimes(session_cache_dir, rng):
    """Entries written for one template argument are never used for another: fresh runtimes
    (the kernels come from the cache) give each argument its own result."""
    x = qd.field(qd.i32, shape=4, name="tpl_x")
    y = qd.field(qd.i32, shape=4, name="tpl_y")

    @qd.kernel
    def put(f: qd.template(), v: qd.template()):
        for i in f:
            f[i] = v + i

    order = [(x, 3), (y, 3), (x, 7), (y, -2), (x, True)]
    for rnd in range(2):
        qd.init(arch=qd.cpu, cache_dir=session_cache_dir)  # second round: every variant from the cache
        for f, v in (order if rnd == 0 else order[::-1]):
            put(f, v)
            np.testing.assert_array_equal(f.to_numpy(), int(v) + np.arange(4))


def _weighted_energy():
    """Fields x (16) and z (8) with gradients, a scalar loss, and a kernel adding
    w * sin(f[i]) * f[i] over a template field f, with a template weight w, to the loss."""
    x = qd.field(qd.f32, shape=16, needs_grad=True)
    z = qd.field(qd.f32, shape=8, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)

    @qd.kernel
    def energy(f: qd.template(), w: qd.template()):
        for i in f:
            loss[None] += w * qd.sin(f[i]) * f[i]

    return x, z, loss, energy


def _energy(w: float, v: np.ndarray) -> float:
    """What energy(f, w) adds to the loss for f holding v."""
    return float((w * np.sin(v) * v).sum())


def _energy_grad(w: float, v: np.ndarray) -> np.ndarray:
    """The gradient of _energy(w, v) by v, analytically."""
    return w * (np.cos(v) * v + np.sin(v))


def test_grad_and_tape_with_template_fields(arch, rng):
    x, z, loss, energy = _weighted_energy()
    vx, vz = rng.random(16).astype(np.float32), rng.random(8).astype(np.float32)
    x.from_numpy(vx)
    z.from_numpy(vz)
    with qd.ad.Tape(loss=loss):
        energy(x, 2.0)
        energy(z, 0.5)
    np.testing.assert_allclose(loss[None], _energy(2, vx) + _energy(0.5, vz), rtol=1e-5)
    np.testing.assert_allclose(x.grad.to_numpy(), _energy_grad(2, vx), rtol=1e-5)
    np.testing.assert_allclose(z.grad.to_numpy(), _energy_grad(0.5, vz), rtol=1e-5)
    x.grad.fill(0)
    loss.grad[None] = 1.0
    energy.grad(x, 3.0)
    np.testing.assert_allclose(x.grad.to_numpy(), _energy_grad(3, vx), rtol=1e-5)


def test_template_argument_mistakes():
    x = qd.field(qd.f32, shape=4)

    @qd.kernel
    def k(f: qd.template(), s: qd.f32):
        for i in f:
            f[i] = s

    with pytest.raises(TypeError, match=r"k\(\) missing 1 required positional argument: 's'"):
        k(x)
    for array in (np.zeros(4, np.float32), qd.ndarray(qd.f32, shape=(4,))):  # an ndarray parameter's argument
        with pytest.raises(TypeError, match="template argument 'f' of kernel 'k'.*qd.types.ndarray"):
            k(array, 1.0)
    with pytest.raises(TypeError, match="not hashable"):
        k({"a": 1}, 1.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'g'"):
        k(x, 1.0, g=2)
    with pytest.raises(TypeError, match="has no template parameter 'g'"):
        qd.aot.instantiate(k, g=x)
    with pytest.raises(TypeError, match="template parameter 'f' needs a value"):
        qd.aot.instantiate(k)


def test_template_and_plain_kernels_both_launch_on_their_own():
    x = qd.field(qd.f32, shape=4)

    @qd.kernel
    def plain(s: qd.f32):
        for i in x:
            x[i] = s

    @qd.kernel
    def templated(f: qd.template(), s: qd.f32):
        for i in f:
            f[i] = s

    plain(1.0)
    templated(x, 2.0)
    assert kernel_of(plain).launches_on_its_own()
    assert kernel_of(templated).launches_on_its_own()  # through its dispatch (TemplateDispatch)
    np.testing.assert_array_equal(x.to_numpy(), [2.0] * 4)
    assert isinstance(kernel_of(templated).template_params, TemplateParams)
    assert kernel_of(plain).template_params is None


def test_qd_abs_min_max_are_the_builtins(arch, rng):
    out = qd.field(qd.f32, shape=(3, 64))

    @qd.kernel
    def k(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            out[0, i] = qd.abs(a[i] - b[i])
            out[1, i] = qd.min(a[i], b[i], 0.5)
            out[2, i] = qd.max(a[i], b[i], a[i] * b[i], 0.25)

    a, b = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    k(a, b)
    got = out.to_numpy()
    np.testing.assert_allclose(got[0], np.abs(a - b), rtol=1e-6)
    np.testing.assert_allclose(got[1], np.minimum(np.minimum(a, b), 0.5), rtol=1e-6)
    np.testing.assert_allclose(got[2], np.maximum.reduce([a, b, a * b, np.full(64, 0.25, np.float32)]), rtol=1e-6)
    assert qd.abs(-2) == 2 and qd.min(3, 1, 2) == 1 and qd.max(1.5, 4, 2) == 4  # Python scope too


def test_vector_fields_as_templates(arch, rng):
    p = qd.Vector.field(3, qd.f32, shape=8)
    q = qd.Vector.field(2, qd.f32, shape=8)

    @qd.kernel
    def norm_sum(f: qd.template()) -> qd.f32:
        s = 0.0
        for i in f:
            s += f[i].norm()
        return s

    a, b = rng.random((8, 3)).astype(np.float32), rng.random((8, 2)).astype(np.float32)
    p.from_numpy(a)
    q.from_numpy(b)
    np.testing.assert_allclose(norm_sum(p), np.linalg.norm(a, axis=1).sum(), rtol=1e-5)
    np.testing.assert_allclose(norm_sum(q), np.linalg.norm(b, axis=1).sum(), rtol=1e-5)
    assert _key(norm_sum, f=p) != _key(norm_sum, f=q)


# ---- the dispatch: a template kernel's call is one dict lookup away from its variant ------------

def _dispatched_launch(k, **templates):
    """The launch function the kernel function's dispatch picks for these template arguments
    (None: the call takes the slow path), and the one the slow path holds for them."""
    kernel = kernel_of(k)
    bound = kernel.template_params.bind(templates)
    key = tuple(x for v in bound.values.values() for x in (v.__class__, v))
    held = kernel._launchers.get(("forward", (bound.key, ())))
    return kernel._dispatch.variants.get(key), held[1] if held else None


def test_the_dispatch_binds_each_call_to_its_own_field_and_value(arch, rng):
    a = qd.field(qd.f32, shape=8)
    b = qd.field(qd.f32, shape=8)  # declared alike: one cache entry, two variants bound apart
    c = qd.field(qd.f32, shape=5)

    @qd.kernel
    def put(f: qd.template(), v: qd.template(), s: qd.f32):
        for i in f:
            f[i] = v * s + i

    values = [1, 1.0, True, 2, 2.5, np.int64(3), np.float32(0.5), np.bool_(True)]
    fields = [a, b, c]
    for _ in range(300):  # alternate at random: every call must land on its own field and value
        f = fields[rng.integers(3)]
        v = values[rng.integers(len(values))]
        s = float(rng.random())
        f.fill(-1)
        before = [g.to_numpy() for g in fields if g is not f]
        put(f, v, s)
        np.testing.assert_allclose(f.to_numpy(), np.float32(float(v) * np.float32(s)) + np.arange(f.shape[0]),
                                   rtol=1e-6, err_msg=f"field {fields.index(f)}, value {v!r}")
        for old, g in zip(before, [g for g in fields if g is not f]):
            np.testing.assert_array_equal(g.to_numpy(), old)  # no other field touched
    assert kernel_of(put).launches_on_its_own()
    launches = {}
    for f in fields:
        for v in values:
            fast, held = _dispatched_launch(put, f=f, v=v)
            assert fast is held is not None, (f.shape, v)
            launches[fast] = (f, v)
    # 1, 1.0, True and np.bool_(True) are variants of their own, like every field
    assert len(launches) == len(fields) * len(values)


def test_the_dispatch_leaves_other_fields_alone(arch, rng):
    a = qd.field(qd.i32, shape=6)
    b = qd.field(qd.i32, shape=6)

    @qd.kernel
    def bump(f: qd.template(), by: qd.template()):
        for i in f:
            f[i] += by

    want = {a: np.zeros(6, np.int64), b: np.zeros(6, np.int64)}
    for _ in range(200):
        f = a if rng.random() < 0.5 else b
        by = int(rng.integers(1, 4))
        bump(f, by)
        want[f] += by
    np.testing.assert_array_equal(a.to_numpy(), want[a])
    np.testing.assert_array_equal(b.to_numpy(), want[b])


def test_values_the_dispatch_cannot_key_take_the_slow_path(arch):
    out = qd.field(qd.f32, shape=4)

    class AlwaysEqual:  # == says any two are equal: the slow path keys it by identity
        def __init__(self, scale):
            self.scale = scale

        def __eq__(self, other):
            return isinstance(other, AlwaysEqual)

        def __hash__(self):
            return 7

    @qd.kernel
    def signed(f: qd.template(), v: qd.template(), s: qd.f32):
        for i in f:
            f[i] = v * s  # keeps the sign of a zero v

    @qd.kernel
    def pair(f: qd.template(), v: qd.template(), s: qd.f32):
        for i in f:
            f[i] = (v[0] * 10 + v[1]) * s

    @qd.kernel
    def scaled(f: qd.template(), v: qd.template(), s: qd.f32):
        for i in f:
            f[i] = (v.scale + i) * s

    cases = [(signed, 0.0, [0.0] * 4), (signed, -0.0, [-0.0] * 4), (signed, 4.0, [4.0] * 4),
             (pair, (1, 2), [12.0] * 4), (pair, (1.5, 2), [17.0] * 4), (pair, [2, 1], [21.0] * 4)]
    first, second = AlwaysEqual(1.5), AlwaysEqual(2.5)
    cases += [(scaled, first, 1.5 + np.arange(4)), (scaled, second, 2.5 + np.arange(4))]
    for _ in range(3):
        for k, v, want in cases:
            out.fill(0)
            k(out, v, 1.0)
            got, want = out.to_numpy(), np.asarray(want, np.float32)
            np.testing.assert_array_equal(got, want, err_msg=repr(v))
            if arch == "cpu":  # the Vulkan target loses the sign of a zero even without templates
                np.testing.assert_array_equal(np.signbit(got), np.signbit(want), err_msg=repr(v))
        with pytest.raises(TypeError, match="template argument 'v' of kernel 'pair': a dict .* not hashable"):
            pair(out, {0: 1, 1: 2}, 1.0)  # the dispatch cannot hash it either: the slow path names it
    # -0.0 == 0.0 and (1, 2) == (1.0, 2): never keys of the dispatch; nonzero floats are
    assert _dispatched_launch(signed, f=out, v=0.0)[0] is None
    assert _dispatched_launch(signed, f=out, v=0.0)[1] is not _dispatched_launch(signed, f=out, v=-0.0)[1]
    assert _dispatched_launch(signed, f=out, v=4.0)[0] is not None
    assert _dispatched_launch(pair, f=out, v=(1, 2))[0] is None
    assert _dispatched_launch(scaled, f=out, v=first)[0] is None


def test_the_dispatch_after_qd_init_and_under_tapes(session_cache_dir, rng):
    x, z, loss, energy = _weighted_energy()

    def forward_and_gradients(vx, vz):
        x.from_numpy(vx)
        z.from_numpy(vz)
        for _ in range(5):  # warm: the kernel function dispatches on its own
            loss[None] = 0
            energy(x, 2.0)
            energy(z, 0.5)
        assert kernel_of(energy).launches_on_its_own()
        with qd.ad.Tape(loss=loss):
            assert not kernel_of(energy).launches_on_its_own()  # the Tape sees every call
            energy(x, 2.0)
            energy(z, 0.5)
            energy(x, 2.0)
        np.testing.assert_allclose(loss[None], _energy(4, vx) + _energy(0.5, vz), rtol=1e-5)
        np.testing.assert_allclose(x.grad.to_numpy(), _energy_grad(4, vx), rtol=1e-5)
        np.testing.assert_allclose(z.grad.to_numpy(), _energy_grad(0.5, vz), rtol=1e-5)
        loss[None] = 0
        energy(z, 0.5)  # after the Tape: dispatching again
        assert kernel_of(energy).launches_on_its_own()
        np.testing.assert_allclose(loss[None], _energy(0.5, vz), rtol=1e-5)

    forward_and_gradients(rng.random(16).astype(np.float32), rng.random(8).astype(np.float32))
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)  # fields re-materialise; old launches must not run
    assert not kernel_of(energy).launches_on_its_own()
    forward_and_gradients(rng.random(16).astype(np.float32), rng.random(8).astype(np.float32))


class _Mode(enum.Enum):  # enum members: keyed by identity, as the slow path keys them
    SUM = 1
    SQUARES = 2


def test_the_dispatch_returns_values_and_takes_keywords(arch, rng):
    x = qd.field(qd.f32, shape=16)
    y = qd.field(qd.f32, shape=16)

    @qd.kernel
    def reduce(f: qd.template(), mode: qd.template(), scale: qd.f32) -> qd.f32:
        s = 0.0
        for i in f:
            if qd.static(mode is _Mode.SQUARES):
                s += f[i] * f[i] * scale
            else:
                s += f[i] * scale
        return s

    data = {x: rng.random(16).astype(np.float32), y: rng.random(16).astype(np.float32)}
    for f, v in data.items():
        f.from_numpy(v)
    for _ in range(50):
        f = x if rng.random() < 0.5 else y
        mode = _Mode.SUM if rng.random() < 0.5 else _Mode.SQUARES
        scale = float(rng.random())
        v = data[f].astype(np.float64)
        want = ((v * v) if mode is _Mode.SQUARES else v).sum() * np.float32(scale)
        np.testing.assert_allclose(reduce(f, mode, scale), want, rtol=1e-5)
        np.testing.assert_allclose(reduce(scale=scale, mode=mode, f=f), want, rtol=1e-5)
    assert len(kernel_of(reduce)._dispatch.variants) == 4  # every (field, mode) dispatched
