"""@qd.data_oriented: kernels defined as methods take their instance as a template argument (its
fields are the kernel's, its numbers compile-time values); two instances are two variants."""
import numpy as np
import pytest

import qdc as qd


@qd.data_oriented
class Particles:
    def __init__(self, n, drag):
        self.x = qd.field(qd.f32, shape=n)
        self.v = qd.Vector.field(2, qd.f32, shape=n)
        self.drag = drag

    @qd.kernel
    def step(self, dt: qd.f32):
        for i in self.x:
            self.x[i] += dt * self.v[i].sum() * self.drag

    @qd.kernel
    def total(self) -> qd.f32:
        s = 0.0
        for i in self.x:
            s += self.x[i]
        return s


def test_kernel_methods(arch, rng):
    qd.init(arch=arch)
    a, b = Particles(16, 0.5), Particles(8, 2.0)
    va, vb = rng.standard_normal((16, 2)).astype(np.float32), rng.standard_normal((8, 2)).astype(np.float32)
    a.v.from_numpy(va)
    b.v.from_numpy(vb)
    for _ in range(3):
        a.step(0.1)
        b.step(0.2)
    np.testing.assert_allclose(a.x.to_numpy(), 3 * 0.1 * va.sum(1) * 0.5, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.x.to_numpy(), 3 * 0.2 * vb.sum(1) * 2.0, rtol=1e-5, atol=1e-6)
    assert a.total() == pytest.approx(float(a.x.to_numpy().sum()), rel=1e-5, abs=1e-5)
    assert Particles._data_oriented


def test_instances_as_template_arguments(rng):
    @qd.kernel
    def scale(p: qd.template(), k: qd.f32):
        for i in p.x:
            p.x[i] *= k * p.drag

    p = Particles(4, 3.0)
    p.x.from_numpy(np.arange(4, dtype=np.float32))
    scale(p, 2.0)
    np.testing.assert_allclose(p.x.to_numpy(), np.arange(4) * 6.0)


def test_options():
    @qd.data_oriented(stable_members=True)
    class Stable:
        pass

    assert Stable._qd_stable_members
    with pytest.raises(NotImplementedError, match="template_primitives=False"):
        qd.data_oriented(template_primitives=False)(type("Mutable", (), {}))
    with pytest.raises(TypeError, match="decorates a class"):
        qd.data_oriented(lambda: None)


@qd.data_oriented
class _Grid:
    def __init__(self, res, batch):
        self.res = np.asarray(res, dtype=np.int32)  # a small numpy array: `*self.res` compiles its values in
        self.batch = batch
        self.count = qd.field(qd.i32, shape=())
        self.sums = qd.field(qd.i32, shape=3)

    @qd.kernel
    def visit(self):
        for i, j, b in qd.ndrange(*self.res, self.batch):
            self.count[None] += 1
            self.sums[0] += i
            self.sums[1] += j
            self.sums[2] += b


def test_a_small_numpy_array_of_the_object_spreads_into_ndrange(arch):
    for res, batch in [((3, 5), 2), ((4, 2), 3)]:
        grid = _Grid(res, batch)
        grid.visit()
        n0, n1 = res
        assert grid.count[None] == n0 * n1 * batch
        assert grid.sums.to_numpy().tolist() == [batch * n1 * n0 * (n0 - 1) // 2, batch * n0 * n1 * (n1 - 1) // 2,
                                                 n0 * n1 * batch * (batch - 1) // 2]


def test_the_spread_values_are_in_the_cache_key():
    from qdc.compiler.driver import cache_key
    from qdc.compiler.driver.templates import TemplateArgs
    from qdc.compiler.jit.api import direct_options
    from qdc.compiler.jit.kernel import kernel_of
    k = kernel_of(_Grid.visit)

    def key(grid):
        return cache_key.kernel_key(k.fn, k.params, direct_options(), "cpu", templates=TemplateArgs({"self": grid}, "visit")).key
    assert key(_Grid((3, 5), 2)) == key(_Grid((3, 5), 2)) != key(_Grid((3, 6), 2))


@qd.data_oriented
class _Spring:
    def __init__(self, n, stiffness):
        self.x = qd.field(qd.f32, shape=n, needs_grad=True)
        self.energy = qd.field(qd.f32, shape=(), needs_grad=True)
        self.stiffness = stiffness

    @qd.kernel
    def compute(self, rest: qd.f32):
        for i in self.x:
            self.energy[None] += 0.5 * self.stiffness * (self.x[i] - rest) ** 2


def test_a_kernel_method_and_its_grad_are_bound_to_the_instance(arch, rng):
    """`obj.compute.grad(...)` passes `obj` as `obj.compute(...)` does (Quadrants' idiom, Genesis's
    `self.g2p.grad(f, ...)`), also inside a Tape; read from the class the kernel is the function."""
    from qdc.compiler.jit.kernel import kernel_of
    spring = _Spring(9, 3.0)
    x0 = rng.standard_normal(9).astype(np.float32)
    spring.x.from_numpy(x0)
    spring.compute(0.25)
    assert spring.energy[None] == pytest.approx(0.5 * 3.0 * float(((x0.astype(np.float64) - 0.25) ** 2).sum()), rel=1e-5)
    spring.energy.grad[None] = 1.0
    spring.compute.grad(0.25)
    np.testing.assert_allclose(spring.x.grad.to_numpy(), 3.0 * (x0 - 0.25), rtol=1e-5, atol=1e-6)
    with qd.ad.Tape(loss=spring.energy):
        spring.compute(-0.5)
    np.testing.assert_allclose(spring.x.grad.to_numpy(), 3.0 * (x0 + 0.5), rtol=1e-5, atol=1e-6)
    _Spring.compute(spring, 0.0)  # through the class, the instance passed by hand
    assert kernel_of(_Spring.compute) is kernel_of(spring.compute) is not None
    assert spring.compute.__self__ is spring
