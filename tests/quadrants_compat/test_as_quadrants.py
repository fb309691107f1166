"""A Quadrants program runs unchanged on qdc: `qdc.install_as_quadrants()` (and `python -m
qdc.as_quadrants SCRIPT`) make `import quadrants` and the submodules programs use resolve to qdc.
Each program runs in a fresh interpreter: installing changes the process's imports."""
import os
import subprocess
import sys
import textwrap

import pytest

# A program in Genesis's style: Quadrants' init options, the tensor API, a data-oriented solver,
# fills of 0-d fields deferred to the materialization hook, logging redirected, perf_dispatch.
PROGRAM = textwrap.dedent('''
    import sys
    import numpy as np
    import quadrants as qd
    from quadrants.lang import impl
    from quadrants.algorithms import sort_scratch_slots

    pending = []
    _materialize = impl.PyQuadrants.materialize

    def materialize_then_fill(self):
        _materialize(self)
        fills = pending.copy()
        pending.clear()
        for tensor, value in fills:
            tensor.fill(value)

    impl.PyQuadrants.materialize = materialize_then_fill

    qd.init(arch=qd.cpu, enable_fallback=False, force_scalarize_matrix=True, advanced_optimization=True,
            cfg_optimization=False, fast_math=False, default_fp=qd.f64, default_ip=qd.i32, log_level=qd.WARN,
            ad_stack_sparse_threshold_bytes=200_000_000, ad_stack_experimental_enabled=True,
            offline_cache_max_size_of_files=2**31 - 1, cpu_max_num_threads=1, random_seed=0)
    messages = []
    qd._logging.warn = lambda msg, *a, **k: messages.append(msg)
    qd.lang._template_mapper.__builtins__["__debug__"] = False
    assert impl.get_runtime().default_fp == qd.f64

    def scalar(dtype, value):
        t = qd.tensor(dtype, shape=(), backend=qd.Backend.FIELD)
        pending.append((t, value))
        return t

    @qd.data_oriented
    class Falling:
        def __init__(self, n):
            self.z = qd.tensor(qd.f64, shape=(n,), backend=qd.Backend.FIELD)
            self.vz = qd.Vector.tensor(1, qd.f64, (n,), backend=qd.Backend.NDARRAY)
            self.dt = scalar(qd.f64, 0.01)
            self.g = scalar(qd.f64, -9.81)

        @qd.kernel(fastcache=True)
        def step(self, vz: qd.Tensor):
            for i in self.z:
                vz[i][0] += self.g[None] * self.dt[None]
                self.z[i] += vz[i][0] * self.dt[None]

    body = Falling(4)
    for _ in range(100):
        body.step(body.vz)
    z, dt, g = body.z.to_numpy(), 0.01, -9.81
    expected = sum(g * dt * dt * k for k in range(1, 101))
    assert np.allclose(z, expected), (z, expected)
    assert isinstance(body.z, qd.Tensor) and isinstance(body.vz, qd.VectorTensor)
    assert sort_scratch_slots is qd.algorithms.sort_scratch_slots  # the sizes qdc's sort needs
    print("ok", sys.argv[1:], float(z[0]))
''')


def run(args, tmp_path, **env):
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=dict(os.environ, **env), capture_output=True, text=True,
                          timeout=600)


@pytest.fixture
def program(tmp_path):
    path = tmp_path / "program.py"
    path.write_text(PROGRAM, encoding="utf-8")
    return path


def test_install_as_quadrants(program, tmp_path):
    launcher = tmp_path / "launch.py"
    launcher.write_text(f"import qdc\nqdc.install_as_quadrants()\nimport runpy, sys\nsys.argv = ['x', 'a']\n"
                        f"runpy.run_path({str(program)!r}, run_name='__main__')\n", encoding="utf-8")
    result = run([str(launcher)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok ['a']")


def test_python_m_as_quadrants(program, tmp_path):
    result = run(["-m", "qdc.as_quadrants", str(program), "b", "--flag"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok ['b', '--flag']")


def test_quadrants_is_qdc_and_unknown_names_are_named(tmp_path):
    script = tmp_path / "names.py"
    script.write_text(textwrap.dedent('''
        import qdc
        qdc.install_as_quadrants()
        import quadrants, quadrants.lang.impl, quadrants.math
        assert quadrants is qdc and quadrants.lang.impl.get_runtime() is not None
        try:
            import quadrants.sparse
        except ModuleNotFoundError as e:
            assert "quadrants.sparse" in str(e), e
        else:
            raise AssertionError("quadrants.sparse imported")
        try:
            quadrants.root
        except AttributeError as e:
            assert "root" in str(e)
        print("ok")
    '''), encoding="utf-8")
    result = run([str(script)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_installing_after_quadrants_was_imported_is_refused(tmp_path):
    script = tmp_path / "late.py"
    script.write_text("import sys, types\nsys.modules['quadrants'] = types.ModuleType('quadrants')\n"
                      "import qdc\ntry:\n    qdc.install_as_quadrants()\nexcept RuntimeError as e:\n"
                      "    print('refused', 'before anything imports quadrants' in str(e))\n", encoding="utf-8")
    result = run([str(script)], tmp_path)
    assert result.stdout.strip() == "refused True", result.stderr
