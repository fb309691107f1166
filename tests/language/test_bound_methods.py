"""Methods bound to instances, called in kernels as in Quadrants: `self.helper(x)` of a
`@qd.data_oriented` class, a qd.func method stored apart from its object (`self.update =
self._update_elastic`, then `self.updates[k](...)` in another object's kernel) and a plain
Python method (inlined like a qd.func). `self` in the method is the object it was read from:
its numbers are compile-time values, its fields and ndarrays are reached through it."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np

import qdc as qd
from qdc.compiler.driver import cache_key
from qdc.compiler.driver.templates import TemplateArgs
from qdc.compiler.jit.api import direct_options
from qdc.compiler.jit.kernel import kernel_of

F32_1D = qd.types.ndarray(dtype=qd.f32, ndim=1)


@qd.data_oriented
class Material:
    def __init__(self, stiffness, offsets):
        self.stiffness = stiffness
        self.offsets = offsets  # an ndarray the method reads: passed at each launch, by its path
        self.update = self._update_linear  # bound here, called from the solver's kernel

    @qd.func
    def _update_linear(self, x, i, scale=1.0):
        return scale * self.stiffness * x + self.offsets[i]

    def damped(self, x):  # a plain method: inlined like a qd.func
        return x * (1.0 - 0.5 / self.stiffness)


@qd.data_oriented
class Solver:
    def __init__(self, materials, n):
        self.materials = materials
        self.updates = [m.update for m in materials]
        self.x = qd.field(qd.f32, shape=n)
        self.out = qd.field(qd.f32, shape=n)

    @qd.func
    def clamp_to(self, v, bound):
        return qd.min(qd.max(v, -bound), bound) + self.x[0] * 0.0

    @qd.kernel
    def step(self, which: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for i in self.x:
            v = 0.0
            for k in qd.static(range(len(self.updates))):
                if which[i] == k:
                    v = self.updates[k](self.x[i], i, scale=2.0) + self.materials[k].damped(self.x[i])
            self.out[i] = self.clamp_to(v, 50.0)


def _reference(materials, x, which):
    out = np.zeros_like(x, dtype=np.float64)
    for i, k in enumerate(which):
        m = materials[k]
        v = 2.0 * m.stiffness * x[i] + m.offsets[i] + x[i] * (1.0 - 0.5 / m.stiffness)
        out[i] = min(max(v, -50.0), 50.0)
    return out


def test_methods_bound_to_objects_of_a_template_argument(arch, rng):
    n = 41
    materials = [Material(k, rng.standard_normal(n).astype(np.float32)) for k in (2.0, 3.5, 5.0)]
    solver = Solver(materials, n)
    x = rng.uniform(-8.0, 8.0, n).astype(np.float32)
    which = rng.integers(0, len(materials), n).astype(np.int32)
    solver.x.from_numpy(x)
    solver.step(which)
    np.testing.assert_allclose(solver.out.to_numpy(), _reference(materials, x.astype(np.float64), which),
                               rtol=1e-5, atol=1e-5)
    # the ndarray a method reads is the one the object holds now, at each launch
    materials[1].offsets = rng.standard_normal(n).astype(np.float32)
    materials[1].update = materials[1]._update_linear
    solver.updates[1] = materials[1].update
    solver.step(which)
    np.testing.assert_allclose(solver.out.to_numpy(), _reference(materials, x.astype(np.float64), which),
                               rtol=1e-5, atol=1e-5)


def test_a_method_read_from_an_instance_is_bound_as_in_python():
    m = Material(2.0, np.zeros(1, np.float32))
    assert m.update.__self__ is m and m.update.__func__ is Material.__dict__["_update_linear"]
    assert Material._update_linear is Material.__dict__["_update_linear"]  # from the class: unbound
    assert m.update == m._update_linear and m.update != Material(2.0, m.offsets).update


def _key_of_step(solver) -> str:
    k = kernel_of(Solver.step)
    return cache_key.kernel_key(k.fn, k.params, direct_options(), "cpu", templates=TemplateArgs({"self": solver}, "step")).key


def test_the_cache_key_holds_the_bound_objects_values(rng):
    offsets = np.zeros(4, np.float32)
    first = Solver([Material(2.0, offsets), Material(3.0, offsets)], 4)
    same = Solver([Material(2.0, offsets), Material(3.0, offsets)], 4)
    other = Solver([Material(2.0, offsets), Material(4.0, offsets)], 4)
    assert _key_of_step(first) == _key_of_step(same)
    assert _key_of_step(first) != _key_of_step(other)


def test_a_second_process_compiles_nothing(tmp_path):
    script = tmp_path / "bound.py"
    script.write_text(textwrap.dedent("""\
        import sys
        import numpy as np
        import qdc as qd
        from qdc.compiler.driver import kernel as compiling
        compiled = []
        _compile = compiling.compile_kernel
        compiling.compile_kernel = lambda fn, *a, **k: compiled.append(fn.__name__) or _compile(fn, *a, **k)
        sys.path.insert(0, sys.argv[1])
        from test_bound_methods import Material, Solver
        qd.init(arch=qd.cpu, cache_dir=sys.argv[2])
        solver = Solver([Material(2.0, np.arange(6, dtype=np.float32))], 6)
        solver.x.from_numpy(np.arange(6, dtype=np.float32))
        solver.step(np.zeros(6, np.int32))
        print(len(compiled), solver.out.to_numpy().tolist())
        """), encoding="utf-8")
    here = os.path.dirname(os.path.abspath(__file__))
    runs = [subprocess.run([sys.executable, str(script), here, str(tmp_path / "c")], capture_output=True, text=True)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    first, second = (r.stdout.split(maxsplit=1) for r in runs)
    assert first[0] != "0" and second[0] == "0" and first[1] == second[1], (first, second)


BOUND_APP = '''
import json
import sys

import numpy as np
import qdc as qd


@qd.data_oriented
class Material:
    def __init__(self, stiffness):
        self.stiffness = stiffness
        self.update = self._update  # a method of the object, held by the object

    @qd.func
    def _update(self, x):
        return self.stiffness * x


@qd.data_oriented
class Solver:
    def __init__(self, stiffnesses, res):
        self.updates = [Material(k).update for k in stiffnesses]
        self.res = np.asarray(res, dtype=np.int32)
        self.out = qd.field(qd.f32, shape=(int(np.prod(res)), len(stiffnesses)))

    @qd.kernel
    def run(self):
        for i, j in qd.ndrange(*self.res):
            for k in qd.static(range(len(self.updates))):
                self.out[i * self.res[1] + j, k] = self.updates[k](float(i + j))


qd.init(arch=qd.cpu, cache_dir=sys.argv[1])
solver = Solver((2.0, 3.0), (3, 4))
solver.run()
print(json.dumps(solver.out.to_numpy().tolist()))
'''


def test_bound_methods_and_spread_arrays_are_recorded_built_and_run_offline(tmp_path):
    (tmp_path / "bound_app.py").write_text(BOUND_APP, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("QDC_RECORD", "QDC_OFFLINE", "QDC_REMOTE")}

    def run(*args, **extra):
        r = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=tmp_path,
                           env={**env, **extra}, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    recorded = run("-m", "qdc.cli.main", "record", "-o", "kernels.manifest", "--", sys.executable, "bound_app.py", "first")
    built = run("-m", "qdc.cli.main", "build", "--manifest", "kernels.manifest", "--cache", "built", "-j", "1")
    assert "1 built" in built, built
    offline = run("bound_app.py", "built", QDC_OFFLINE="1")
    want = [[k * (i + j) for k in (2.0, 3.0)] for i in range(3) for j in range(4)]
    assert json.loads(offline.strip().splitlines()[-1]) == want
    assert json.loads(recorded.strip().splitlines()[-1]) == want
