"""Structs as kernel parameters (passed by value) and return values, as in Quadrants:
`def k(s: MyStruct)` with `MyStruct = qd.types.struct(...)` or a `@qd.dataclass`, nested
structs and vector/matrix members; the argument is a dict of the members (what `MyStruct(...)`
makes in Python scope) or an object with them as attributes; `-> MyStruct` returns a dict of
the members whose members also read as attributes. The front end splits a struct into scalar
parameters (one metadata record per scalar, runtime/contract/artifact.py), so every backend
sees scalars only. Checked against Python references on random values, directly and ahead of
time (`qdc build` + `qdc.runtime.load`), and through PTX/SPIR-V/MSL/AMDGPU builds."""
import subprocess
import sys

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import kernel as K
from qdc.compiler.driver.options import Options
from qdc.compiler.targets.cuda import toolkit
from qdc.compiler.targets.spirv import tools as spirv_tools
from qdc.runtime.contract import artifact as A
from qdc.runtime.contract.artifact_schema import check_kernel_meta


def test_nested_struct_with_a_matrix_member(arch, rng):
    mat = qd.types.matrix(3, 2, qd.f32)
    s0 = qd.types.struct(a=mat, b=qd.f32)
    s1 = qd.types.struct(a=qd.i32, b=s0)

    @qd.kernel
    def weighted(a: s1) -> qd.f32:
        ret = a.a + a.b.b
        for i in range(3):
            for j in range(2):
                ret += a.b.a[i, j] * (i + 1) * (j + 2)
        return ret

    m = rng.integers(-9, 10, (3, 2)).astype(np.float32)
    n, b = int(rng.integers(-100, 100)), float(rng.integers(-100, 100))
    want = n + b + sum(m[i, j] * (i + 1) * (j + 2) for i in range(3) for j in range(2))
    assert weighted(s1(a=n, b=s0(a=m, b=b))) == want
    assert weighted({"a": n, "b": {"a": m.tolist(), "b": b}}) == want  # plain dicts and lists


@qd.dataclass
class Inner:
    b: qd.f64
    n: qd.i32


@qd.dataclass
class Particle:
    a: qd.f32
    v: qd.math.vec3
    inner: Inner

    @qd.func
    def energy(self):
        return 0.5 * self.a * self.v.dot(self.v)


def test_dataclass_parameters_methods_and_returned_structs(arch, rng):
    @qd.kernel
    def step(p: Particle, k: qd.i32) -> tuple[qd.f32, Particle]:
        q = p
        q.v *= k
        q.inner.n += k
        q.inner.b = q.inner.b * 2
        return p.energy(), q

    a = float(np.float32(rng.uniform(0.5, 2)))
    v = rng.uniform(-1, 1, 3).astype(np.float32)
    b, n, k = float(rng.uniform(-1, 1)), int(rng.integers(-50, 50)), int(rng.integers(1, 5))
    energy, q = step(Particle(a=a, v=v, inner=Inner(b=b, n=n)), k)
    assert energy == pytest.approx(0.5 * a * float(v.astype(np.float64) @ v), rel=1e-6)
    assert set(q) == {"a", "v", "inner"} and q.a == q["a"] == a
    np.testing.assert_array_equal(q.v, v * k)
    assert q.inner == {"b": 2 * b, "n": n + k} and q.inner.b == 2 * b  # f64 member: exact
    assert q.to_dict() == {"a": a, "v": (v * k).tolist(), "inner": {"b": 2 * b, "n": n + k}}
    energy2, r = step(q, 1)  # a returned struct is an argument as it is
    np.testing.assert_array_equal(r.v, q.v)
    assert energy2 == pytest.approx(0.5 * a * float((v * k).astype(np.float64) @ (v * k)), rel=1e-6)


def test_a_dataclass_built_by_position_in_python_scope(arch, rng):
    """`Inner(b, n)` from Python fills the members in declaration order, as in a kernel;
    mixing in a member's name twice or passing too many values is a TypeError."""
    @qd.kernel
    def twice(p: Inner) -> Inner:
        return Inner(p.b * 2, p.n * 2)

    b, n = float(rng.uniform(-1, 1)), int(rng.integers(-50, 50))
    assert twice(Inner(b, n)) == {"b": 2 * b, "n": 2 * n}
    assert Inner(b) == {"b": b, "n": 0} and Inner(b, n=n) == Inner(n=n, b=b)
    with pytest.raises(TypeError, match="given by position and by name"):
        Inner(b, b=b)
    with pytest.raises(TypeError, match="has 2 member"):
        Inner(b, n, 3)


def test_an_object_with_the_members_as_attributes(arch, rng):
    S = qd.types.struct(x=qd.f32, y=qd.i32)

    class Plain:
        def __init__(self, x, y):
            self.x, self.y = x, y

    @qd.kernel
    def combine(s: S, t: qd.f32) -> qd.f32:
        return s.x * t + s.y

    x, y, t = float(np.float32(rng.uniform(-2, 2))), int(rng.integers(-9, 9)), 0.5
    assert combine(Plain(x, y), t) == pytest.approx(x * t + y)


def test_a_returned_struct_of_a_kernel_without_parameters(arch):
    S = qd.types.struct(i=qd.i64, f=qd.f16, m=qd.math.mat2)

    @qd.kernel
    def make() -> S:
        return S(i=(1 << 40) + 3, f=0.5, m=qd.Matrix([[1.0, 2.0], [3.0, 4.0]]))

    r = make()
    assert r.i == (1 << 40) + 3 and r.f == 0.5
    np.testing.assert_array_equal(r.m, [[1.0, 2.0], [3.0, 4.0]])


def test_bad_arguments_name_kernel_parameter_and_member(arch):
    S = qd.types.struct(a=qd.f32, v=qd.math.vec3, inner=qd.types.struct(n=qd.i8))

    @qd.kernel
    def use(s: S) -> qd.f32:
        return s.a + s.v.x + s.inner.n

    good = {"a": 1.0, "v": [1.0, 2.0, 3.0], "inner": {"n": 4}}
    assert use(good) == 6.0
    with pytest.raises(KeyError, match=r"kernel 'use', argument 's': .*member 'inner.n' missing"):
        use({**good, "inner": {}})
    with pytest.raises(KeyError, match=r"kernel 'use', argument 's': .*member 'a' missing"):
        use({"v": [1.0, 2.0, 3.0], "inner": {"n": 4}})
    with pytest.raises(KeyError, match="has no such member.*'w'"):
        use({**good, "w": 1.0})
    with pytest.raises(ValueError, match=r"kernel 'use', argument 's', member 'v': expected a vector\(3, f32\)"):
        use({**good, "v": [1.0, 2.0]})
    with pytest.raises(ValueError, match=r"kernel 'use', argument 's', element \.inner\.n: 300 is out of range for i8"):
        use({**good, "inner": {"n": 300}})
    with pytest.raises(TypeError, match=r"kernel 'use', argument 's': expected a struct\(a: f32, v: vector\(3, f32\)"):
        use(1.0)


def test_metadata_records_and_their_checks():
    S = qd.types.struct(a=qd.f32, v=qd.math.vec2, inner=qd.types.struct(n=qd.i32))

    @qd.kernel
    def k(x: qd.f32, s: S, y: qd.i32) -> S:
        return s

    compiled = K.compile_kernel(k._primal.fn, k._primal.params, Options(arch="cpu"), arch="cpu")
    meta = compiled.meta
    assert [(p.name, p.dtype) for p in meta.params] == \
        [("x", "f32"), ("s", "f32"), ("s", "f32"), ("s", "f32"), ("s", "i32"), ("y", "i32")]
    assert [(a.name, a.first, a.count) for a in meta.arguments] == [("x", 0, 1), ("s", 1, 4), ("y", 5, 1)]
    assert meta.record_names() == ["x", "s.a", "s.v[0]", "s.v[1]", "s.inner.n", "y"]
    assert meta.returns["structs"] == [[0, meta.structs["s"]]]
    d = meta.to_dict()
    assert A.KernelMeta.from_dict(d).record_names() == meta.record_names()
    tampered = dict(d, params=[list(p) for p in d["params"]])
    tampered["params"][4][2] = "f32"  # the layout says i32
    with pytest.raises(ValueError, match="scalar records of struct parameter 's'"):
        check_kernel_meta(tampered)
    with pytest.raises(ValueError, match="structs: a struct parameter the kernel does not have"):
        check_kernel_meta(dict(d, structs={**d["structs"], "z": d["structs"]["s"]}))
    without = {key: value for key, value in d.items() if key != "structs"}  # a runtime that knew no structs
    with pytest.raises(ValueError, match="element records of vector parameter 's'"):
        check_kernel_meta(without)
    returns = dict(d["returns"], structs=[[1, d["returns"]["structs"][0][1]]])
    with pytest.raises(ValueError, match="returns"):
        check_kernel_meta(dict(d, returns=returns))


def test_gradient_through_a_struct_parameter_kernel(arch, rng):
    n = 8
    x = qd.field(qd.f32, shape=n, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)
    Coefficients = qd.types.struct(w=qd.f32, c=qd.math.vec2)

    @qd.kernel
    def energy(k: Coefficients):
        for i in x:
            loss[None] += k.w * x[i] * x[i] + k.c[0] * x[i] + k.c[1]

    xs = rng.uniform(-1, 1, n).astype(np.float32)
    w, c = float(np.float32(rng.uniform(0.5, 2))), rng.uniform(-1, 1, 2).astype(np.float32)
    x.from_numpy(xs)
    coefficients = Coefficients(w=w, c=c)
    with qd.ad.Tape(loss=loss):
        energy(coefficients)
    np.testing.assert_allclose(x.grad.to_numpy(), 2 * w * xs + c[0], rtol=1e-5, atol=1e-6)
    want = float(np.sum(w * xs.astype(np.float64) ** 2 + c[0] * xs + c[1]))
    assert loss[None] == pytest.approx(want, rel=1e-5)


def struct_kernel():
    S = qd.types.struct(a=qd.f32, v=qd.math.vec3, d=qd.i64)

    @qd.kernel
    def scaled(s: S, out: qd.types.ndarray(dtype=qd.f32, ndim=1)) -> S:
        for i in out:
            out[i] = s.a * s.v[i % 3] + s.d
        return S(a=s.a * 2, v=s.v, d=s.d + 1)
    return scaled._primal


def test_spirv_ptx_msl_and_amdgpu_builds():
    from qdc.compiler.targets.amdgpu import linker
    from qdc.compiler.targets.metal import msl
    k = struct_kernel()
    vulkan = K.compile_kernel(k.fn, k.params, Options(arch="vulkan"), arch="vulkan").artifacts
    for name, module in vulkan.items():
        if name.startswith("spirv_"):
            assert spirv_tools.validate(module) is None
    ptx = K.compile_kernel(k.fn, k.params, Options(arch="cuda"), arch="cuda").artifacts["ptx"].decode()
    if toolkit.ptxas_path() is not None and toolkit.assembling_gpu("sm_90") is not None:
        toolkit.assemble(ptx, toolkit.assembling_gpu("sm_90"))
    if linker.find_lld():
        amdgpu = K.compile_kernel(k.fn, k.params, Options(arch="amdgpu"), arch="amdgpu").artifacts
        assert any(name.startswith("hsaco_") and blob for name, blob in amdgpu.items())
    if msl.spirv_cross_path() is not None:  # Metal has no 64-bit types: an f32/i32 struct
        S = qd.types.struct(a=qd.f32, v=qd.math.vec3, n=qd.i32)

        @qd.kernel
        def metal_kernel(s: S, out: qd.types.ndarray(dtype=qd.f32, ndim=1)) -> S:
            for i in out:
                out[i] = s.a * s.v[i % 3] + s.n
            return s
        m = metal_kernel._primal
        assert "msl_t0" in K.compile_kernel(m.fn, m.params, Options(arch="metal"), arch="metal").artifacts


MODULE = '''
import qdc as qd

total = qd.field(qd.f32, shape=(), needs_grad=True)
x = qd.field(qd.f32, shape=4, needs_grad=True)


@qd.dataclass
class Body:
    m: qd.f32
    v: qd.math.vec3
    tag: qd.types.struct(id=qd.i32, w=qd.f64)


@qd.kernel
def kick(b: Body, dv: qd.math.vec3) -> Body:
    c = b
    c.v += dv
    c.tag.id += 1
    return c


@qd.kernel
def weigh(b: Body):
    for i in x:
        total[None] += b.m * x[i] * x[i]
'''

LOAD = r"""
import sys
import numpy as np
from qdc.runtime import load

mod = load(sys.argv[1], "structmod", arch="cpu")
rng = np.random.default_rng(int(sys.argv[2]))
v, dv = rng.random(3).astype(np.float32), rng.random(3).astype(np.float32)
body = {"m": 2.0, "v": v, "tag": {"id": 7, "w": 0.25}}
r = mod.kick(body, dv)
assert r.m == 2.0 and r.tag.id == 8 and r.tag.w == 0.25 and r["tag"]["id"] == 8, r
assert np.array_equal(r.v, v + dv), r.v
r2 = mod.kick(r, dv)
assert np.array_equal(r2.v, (v + dv) + dv) and r2.tag.id == 9
xs = rng.random(4).astype(np.float32)
mod.x.from_numpy(xs)
mod.weigh(body)
assert np.isclose(mod.total[None], 2.0 * (xs.astype(np.float64) ** 2).sum(), rtol=1e-5)
mod.total.grad[None] = 1.0
mod.weigh.grad(body)
assert np.allclose(mod.x.grad.to_numpy(), 4.0 * xs, rtol=1e-5)
try:
    mod.kick({"m": 2.0, "v": v}, dv)
except KeyError as e:
    assert "kernel 'kick', argument 'b'" in str(e) and "'tag' missing" in str(e), e
else:
    raise AssertionError("a dict missing a member was accepted")
leaked = sorted(n for n in sys.modules if n.startswith(("qdc.compiler", "llvmlite")))
assert not leaked, leaked
print("OK")
"""


def test_built_struct_kernels_load_and_run_without_the_compiler(tmp_path, rng):
    (tmp_path / "structmod.py").write_text(MODULE, encoding="utf-8")
    cache = str(tmp_path / "cache")
    r = subprocess.run([sys.executable, "-m", "qdc.cli.main", "build", str(tmp_path / "structmod.py"),
                        "--cache", cache], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (tmp_path / "load.py").write_text(LOAD, encoding="utf-8")
    r = subprocess.run([sys.executable, str(tmp_path / "load.py"), cache, str(int(rng.integers(1 << 30)))],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "qdc.cli.main", "inspect", "structmod.kick", "--cache", cache],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "param     b: Body(m: f32, v: vector(3, f32), tag: struct(id: i32, w: f64))" in r.stdout, r.stdout


def test_size_limits(arch, tmp_path):
    """A struct parameter's vector members are bounded as vector parameters are (a located error
    naming kernel and parameter); a returned struct's as returned vectors are."""
    from module_util import compile_error_of
    err, path = compile_error_of(tmp_path, "wide_struct", """
        import qdc as qd
        Wide = qd.types.struct(a=qd.f32, v=qd.types.vector(100, qd.f32))

        @qd.kernel
        def bad(s: Wide) -> qd.f32:
            return s.a
        """, {"a": 1.0, "v": [0.0] * 100})
    assert err.filename == str(path) and err.line == 6
    assert "parameter 's' of kernel 'bad' is a struct whose member 'v' has more than 64" in str(err)
    Wide = qd.types.struct(a=qd.f32, v=qd.types.vector(100, qd.i32))

    @qd.kernel
    def make() -> Wide:
        w = Wide(a=0.5)
        for i in qd.static(range(100)):
            w.v[i] = i * i
        return w

    r = make()
    assert r.a == 0.5
    np.testing.assert_array_equal(r.v, np.arange(100) ** 2)
