"""`qdc build` hands its options down explicitly: a kernel module's declarations take the build's
default types (`float`, `int` and vector types without an element type, at import and in
kernel annotations), two builds in one process with different default types each get their
own, and neither reaches the other or direct mode's (`qd.init`'s)."""
import numpy as np
import pytest

import qdc as qd
from qdc.compiler.commands.build import build
from qdc.compiler.driver.options import Options
from qdc.compiler.jit.api import direct_options
from qdc.compiler.jit.kernel import kernel_of
from qdc.runtime.cache import Cache, read_module
from qdc.runtime.contract.python_scope import scope_types
from qdc.runtime.loader import load

SOURCE = '''
import qdc as qd

s = qd.field(float, shape=4)                     # default_fp, when the module is imported
v = qd.Vector.field(3, float, shape=4)           # default_fp too
w = qd.field(qd.types.vector(2), shape=4)        # a vector type without an element type: default_fp
c = qd.Vector.field(2, int, shape=4)             # default_ip


@qd.kernel
def fill(x: float, n: int):                      # annotations: the build's default types too
    for i in v:
        s[i] = x
        v[i] = qd.Vector([x, x * 2.0, x * 3.0])
        w[i] = qd.Vector([x, -x])
        c[i] = qd.Vector([n, n + i])
'''


def _build(tmp_path, name: str, **options) -> str:
    src = tmp_path / f"src_{name}"
    src.mkdir()
    (src / f"{name}.py").write_text(SOURCE, encoding="utf-8")
    cache = str(tmp_path / f"cache_{name}")
    report = build([str(src)], ["cpu"], Options().update(**options), cache, log=lambda _: None, out=lambda _: None)
    assert report.ok and report.built == 1, report.errors
    return cache


def _field_types(cache: str, module: str) -> dict:
    return {f[0]: f[1] for f in read_module(Cache(cache), module, "cpu")["fields"]}


def _run(cache: str, module: str, x: float, n: int) -> dict:
    mod = load(cache, module, arch="cpu")
    mod.fill(x, n)
    return {name: getattr(mod, name).to_numpy() for name in ("s", "v", "w", "c")}


def _direct_types() -> tuple:
    """What direct mode resolves `float`/`int` to now: in Python-scope declarations and in a
    kernel's annotations."""
    field = qd.Vector.field(3, float, shape=1)
    assert qd.field(float, shape=1).dtype is field.dtype and qd.ndarray(float, shape=1).dtype is field.dtype

    @qd.kernel
    def probe(x: float, n: int):
        pass

    params = kernel_of(probe).params
    return field.dtype, params[0].dtype, params[1].dtype


def test_two_builds_with_different_default_types_in_one_process(tmp_path):
    qd.init(arch=qd.cpu)
    before = direct_options()
    wide = _build(tmp_path, "probe_wide", default_fp="f64", default_ip="i64")
    narrow = _build(tmp_path, "probe_narrow", default_fp="f32", default_ip="i32")
    wide_again = _build(tmp_path, "probe_wide_again", default_fp="f64", default_ip="i64")

    assert _field_types(wide, "probe_wide") == {"s": "f64", "v": "f64", "w": "f64", "c": "i64"}
    assert _field_types(narrow, "probe_narrow") == {"s": "f32", "v": "f32", "w": "f32", "c": "i32"}
    assert _field_types(wide_again, "probe_wide_again") == {"s": "f64", "v": "f64", "w": "f64", "c": "i64"}

    big = 2**40 + 3  # fits default_ip only when that is i64
    out = _run(wide, "probe_wide", 0.1, big)
    assert out["v"].dtype == np.float64 and out["c"].dtype == np.int64
    np.testing.assert_array_equal(out["s"], np.full(4, 0.1))
    np.testing.assert_array_equal(out["v"], np.tile([0.1, 0.2, 0.1 * 3.0], (4, 1)))  # x kept as f64: exact
    np.testing.assert_array_equal(out["w"], np.tile([0.1, -0.1], (4, 1)))
    np.testing.assert_array_equal(out["c"], np.stack([np.full(4, big), big + np.arange(4)], axis=1))

    out = _run(narrow, "probe_narrow", 0.1, 7)
    x32 = np.float32(0.1)
    assert out["v"].dtype == np.float32 and out["c"].dtype == np.int32
    np.testing.assert_array_equal(out["s"], np.full(4, x32))
    np.testing.assert_array_equal(out["v"], np.tile(np.array([x32, x32 * np.float32(2), x32 * np.float32(3)]), (4, 1)))
    np.testing.assert_array_equal(out["c"], np.stack([np.full(4, 7), 7 + np.arange(4)], axis=1))

    # direct mode kept its own options and default types throughout
    assert direct_options() is before
    assert _direct_types() == (qd.f32, qd.f32, qd.i32)


def test_a_build_leaves_direct_modes_default_types_as_qd_init_set_them(tmp_path):
    qd.init(arch=qd.cpu, default_fp=qd.f64)
    try:
        assert _direct_types() == (qd.f64, qd.f64, qd.i32)
        narrow = _build(tmp_path, "probe_under_f64_init", default_fp="f32")
        assert _field_types(narrow, "probe_under_f64_init")["v"] == "f32"
        assert _direct_types() == (qd.f64, qd.f64, qd.i32)
        assert scope_types.current() == (qd.i32, qd.f64)
    finally:
        qd.init(arch=qd.cpu)
    assert _direct_types() == (qd.f32, qd.f32, qd.i32)


def test_a_module_failing_at_import_ends_the_builds_import_context(tmp_path):
    qd.init(arch=qd.cpu)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a_first.py").write_text(SOURCE, encoding="utf-8")
    (src / "b_broken.py").write_text("import qdc as qd\nv = qd.Vector.field(3, float, shape=2)\nraise RuntimeError('no')\n", encoding="utf-8")
    errors = []
    report = build([str(src)], ["cpu"], Options().update(default_fp="f64"), str(tmp_path / "cache"),
                   log=errors.append, out=lambda _: None)
    assert not report.ok and any("b_broken.py:3:1: error: importing the module failed: RuntimeError: no" in e
                                 for e in errors), errors
    assert _field_types(str(tmp_path / "cache"), "a_first")["v"] == "f64"
    assert scope_types.current() == (qd.i32, qd.f32)
    assert _direct_types() == (qd.f32, qd.f32, qd.i32)


def test_the_import_context_is_restored_when_its_body_raises():
    outside = scope_types.current()
    with pytest.raises(ValueError):
        with scope_types.importing(qd.i64, qd.f64):
            assert scope_types.current() == (qd.i64, qd.f64)
            assert qd.Vector.field(2, float, shape=1).dtype is qd.f64
            raise ValueError
    assert scope_types.current() == outside
