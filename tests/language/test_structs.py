"""Structs in kernels (docs/api.md): qd.types.struct and @qd.dataclass as locals, func arguments
and results, struct fields (one field per member) with dict to_numpy/from_numpy, member access,
nested structs, gradients through struct fields, and located errors."""
import numpy as np
import pytest

import qdc as qd

Particle = qd.types.struct(mass=qd.f32, pos=qd.math.vec3, count=qd.i32)


@qd.dataclass
class Sphere:
    radius: qd.f32
    center: qd.math.vec2

    @qd.func
    def area(self):
        return 3.0 * self.radius * self.radius

    @qd.func
    def shifted(self, dx):
        return Sphere(radius=self.radius, center=self.center + dx)


Body = qd.types.struct(shape=Sphere, weight=qd.f64)


def test_struct_field_member_access_and_numpy_round_trip(arch, rng):
    n = 9
    p = Particle.field(shape=n)
    mass = rng.random(n).astype(np.float32)
    pos = rng.standard_normal((n, 3)).astype(np.float32)
    count = rng.integers(-50, 50, n).astype(np.int32)
    p.from_numpy({"mass": mass, "pos": pos, "count": count})

    @qd.kernel
    def step(dt: qd.f32):
        for i in p:
            p[i].pos += p[i].mass * dt
            p[i].pos.y = p[i].pos.x * 2.0
            p[i].count += 1
            p[i].mass *= 0.5

    dt = float(rng.random())
    step(dt)
    out = p.to_numpy()
    expected = pos + mass[:, None] * np.float32(dt)
    expected[:, 1] = expected[:, 0] * 2
    np.testing.assert_allclose(out["pos"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out["count"], count + 1)
    np.testing.assert_allclose(out["mass"], mass * 0.5, rtol=1e-6)
    assert set(p[3]) == {"mass", "pos", "count"} and p[3]["count"] == count[3] + 1


def test_struct_locals_whole_assignment_and_struct_of_fields(arch, rng):
    n = 7
    src = qd.Struct.field({"a": qd.f32, "v": qd.math.vec3}, shape=n)
    dst = qd.Struct.field({"a": qd.f32, "v": qd.math.vec3}, shape=n)
    a, v = rng.random(n).astype(np.float32), rng.random((n, 3)).astype(np.float32)
    src.from_numpy({"a": a, "v": v})

    @qd.kernel
    def copy_scaled():
        for i in src:
            s = src[i]               # a struct local
            s.a += 1.0
            s.v.z = s.a * 2.0
            t = s                    # a copy
            t.a = 0.0
            dst[n - 1 - i] = s       # a whole struct store

    copy_scaled()
    out = dst.to_numpy()
    expected_v = v.copy()
    expected_v[:, 2] = (a + 1) * 2
    np.testing.assert_allclose(out["a"], (a + 1)[::-1], rtol=1e-6)
    np.testing.assert_allclose(out["v"], expected_v[::-1], rtol=1e-6)


def test_dataclass_methods_nested_structs_and_func_results(arch, rng):
    n = 6
    bodies = Body.field(shape=n)
    r = rng.random(n).astype(np.float32) + 0.5
    c = rng.standard_normal((n, 2)).astype(np.float32)
    w = rng.random(n)
    bodies.from_numpy({"shape": {"radius": r, "center": c}, "weight": w})
    areas = qd.field(qd.f32, shape=n)

    @qd.func
    def heavier(b, k):
        b.weight *= k
        return b

    @qd.kernel
    def update(dx: qd.f32):
        for i in bodies:
            b = heavier(bodies[i], 3)
            areas[i] = b.shape.area()
            b.shape = b.shape.shifted(dx)
            bodies[i] = b
            bodies[i].shape.radius += 1

    dx = float(rng.random())
    update(dx)
    out = bodies.to_numpy()
    np.testing.assert_allclose(areas.to_numpy(), 3 * r * r, rtol=1e-5)
    np.testing.assert_allclose(out["shape"]["center"], c + np.float32(dx), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["shape"]["radius"], r + 1, rtol=1e-6)
    np.testing.assert_allclose(out["weight"], w * 3, rtol=1e-12)


def test_struct_constructor_fills_missing_members_with_zero(arch, rng):
    out = Particle.field(shape=())
    base = float(rng.random())

    @qd.kernel
    def make(x: qd.f32):
        s: Particle = Particle(pos=qd.math.vec3(x, 1, 2))
        s.count = 7
        out[None] = s

    make(base)
    got = out.to_numpy()
    assert got["mass"] == 0 and got["count"] == 7
    np.testing.assert_allclose(got["pos"], [base, 1, 2], rtol=1e-6)


def test_gradient_through_struct_field(arch, rng):
    n = 8
    p = Particle.field(shape=n, needs_grad=True)
    loss = qd.field(qd.f32, shape=(), needs_grad=True)
    mass = rng.random(n).astype(np.float32) + 0.5
    pos = rng.standard_normal((n, 3)).astype(np.float32)
    p.from_numpy({"mass": mass, "pos": pos, "count": np.zeros(n, np.int32)})

    @qd.kernel
    def energy():
        for i in p:
            loss[None] += 0.5 * p[i].mass * p[i].pos.dot(p[i].pos)

    with qd.ad.Tape(loss=loss):
        energy()
    grad = p.grad.to_numpy()
    assert set(grad) == {"mass", "pos", "count"}
    np.testing.assert_allclose(grad["mass"], 0.5 * (pos * pos).sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad["pos"], mass[:, None] * pos, rtol=1e-5, atol=1e-6)


def test_unknown_member_is_a_located_error():
    p = Particle.field(shape=4)

    @qd.kernel
    def bad():
        for i in p:
            p[i].speed = 1.0

    with pytest.raises(qd.QdcCompileError) as e:
        bad()
    assert "no member 'speed'" in str(e.value) and "test_structs.py" in str(e.value)
    assert "p[i].speed = 1.0" in str(e.value)


def test_wrong_member_type_is_a_located_error():
    @qd.kernel
    def bad():
        s = Particle(mass=qd.math.vec3(1, 2, 3))
        s.count = 1

    with pytest.raises(qd.QdcCompileError) as e:
        bad()
    assert "member 'mass'" in str(e.value) and "test_structs.py" in str(e.value)


def test_struct_field_python_scope_api():
    p = Particle.field(shape=3, name="particles")
    assert p.mass.shape == (3,) and p.pos.to_numpy().shape == (3, 3)
    with pytest.raises(ValueError, match="members"):
        p.from_numpy({"mass": np.zeros(3)})
    p[1] = {"mass": 2.5, "count": 4}
    assert p[1]["mass"] == 2.5 and p[1]["count"] == 4


AOT_MODULE = '''
import qdc as qd

Cell = qd.types.struct(heat=qd.f32, flow=qd.math.vec2)
cells = Cell.field(shape=16, needs_grad=True)
total = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.kernel
def diffuse(rate: qd.f32):
    for i in cells:
        c = cells[i]
        cells[i].flow = c.flow + c.heat * rate
        total[None] += c.heat * c.heat
'''

AOT_RUN = r'''
import sys
import numpy as np
from qdc.runtime import load

cache, arch, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(seed)
m = load(cache, "structmod", arch=arch)
heat, flow = rng.random(16).astype(np.float32), rng.random((16, 2)).astype(np.float32)
m.cells.from_numpy({"heat": heat, "flow": flow})
rate = float(np.float32(rng.random()))
m.diffuse(rate)
out = m.cells.to_numpy()
assert np.allclose(out["flow"], flow + heat[:, None] * np.float32(rate), rtol=1e-5), out
assert np.allclose(out["heat"], heat)
m.total.grad[None] = 1.0
m.diffuse.grad(rate)
assert np.allclose(m.cells.grad.to_numpy()["heat"], 2 * heat, rtol=1e-5), m.cells.grad.to_numpy()
assert not [k for k in sys.modules if k.startswith("qdc.compiler")]
print("OK")
'''


def test_struct_field_in_a_module_built_ahead_of_time(tmp_path, rng):
    import subprocess
    import sys
    from conftest import vulkan_unavailable_reason
    src = tmp_path / "src"
    src.mkdir()
    (src / "structmod.py").write_text(AOT_MODULE, encoding="utf-8")
    archs = ["cpu"] + (["vulkan"] if vulkan_unavailable_reason() is None else [])
    cache = str(tmp_path / "cache")
    r = subprocess.run([sys.executable, "-m", "qdc.cli.main", "build", str(src), "--cache", cache,
                        "--arch", ",".join(archs)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    script = tmp_path / "run.py"
    script.write_text(AOT_RUN, encoding="utf-8")
    for arch in archs:
        r = subprocess.run([sys.executable, str(script), cache, arch, str(int(rng.integers(1 << 30)))],
                           capture_output=True, text=True)
        assert r.returncode == 0 and "OK" in r.stdout, (arch, r.stdout + r.stderr)
