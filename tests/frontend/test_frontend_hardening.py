"""Front-end hardening: literals never wrap silently, qd.loop_config rejects unknown
keys, strings are not statements, signature errors and warnings point at the user's source,
numpy integer shapes, qd.ndrange arguments and out-of-range `.shape[k]`."""
import linecache
import math
import os
import warnings

import numpy as np
import pytest

import qdc as qd
from qdc.compiler import ir
from qdc.compiler.driver import kernel as kernel_mod
from qdc.compiler.jit.kernel import kernel_of

SOURCE = open(__file__, encoding="utf-8").read().splitlines()

i32 = qd.field(qd.i32, shape=4)
i64 = qd.field(qd.i64, shape=4)
u32 = qd.field(qd.u32, shape=4)
u64 = qd.field(qd.u64, shape=4)
i8 = qd.field(qd.i8, shape=4)
f32 = qd.field(qd.f32, shape=4)
f16 = qd.field(qd.f16, shape=4)
MODE = "fast"


def line_of(text: str) -> int:
    (number,) = [i for i, line in enumerate(SOURCE, 1) if line.rstrip().endswith(text)]
    return number


def kernel_with(statement: str):
    """A kernel whose body is `statement`, with its source registered where inspect finds it."""
    filename = f"<kernel {statement}>"
    text = f"@qd.kernel\ndef k():\n    {statement}\n"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    namespace = {"qd": qd, **{n: v for n, v in globals().items() if isinstance(v, qd.Field)}}
    exec(compile(text, filename, "exec"), namespace)  # noqa: S102
    return namespace["k"]


def compile_error(kernel, *args) -> qd.QdcCompileError:
    with pytest.raises(qd.QdcCompileError) as info:
        kernel(*args)
    assert "internal compiler error" not in str(info.value)
    return info.value


# ---- integer literals ---------------------------------------------------------------------------

def test_a_literal_too_large_for_its_destination_is_an_error_naming_it_and_the_type():
    @qd.kernel
    def store():
        i32[0] = 3000000000  # too large for i32

    e = compile_error(store)
    assert e.line == line_of("3000000000  # too large for i32") and e.source_line is not None
    assert e.col == SOURCE[e.line - 1].index("3000000000") + 1
    assert "integer literal 3000000000 does not fit in i32" in e.raw_message


@pytest.mark.parametrize("expression, text", [("2**70", "'2 ** 70' = 1180591620717411303424"),
                                              ("1 << 100", "'1 << 100' = 1267650600228229401496")])
def test_an_overflowing_constant_expression_is_an_error(expression, text):
    e = compile_error(kernel_with(f"i64[0] = {expression}"))
    assert text in e.raw_message and "does not fit in i64" in e.raw_message


@pytest.mark.parametrize("store", ["u32[0] = -1", "i8[0] = 128", "x: qd.i32 = 2**31", "i32[0] = qd.i32(2**31)",
                                   "i32[0] += 2**40", "i32[0] = 1e10", "f32[0] = 1e39", "f16[0] = 70000.0",
                                   "v = 2**64", "i64[0] = i64[1] + 2**64"])
def test_other_literals_that_do_not_fit(store):
    e = compile_error(kernel_with(store))
    assert "does not fit" in e.raw_message or "too large" in e.raw_message


@qd.kernel
def literals_that_fit():
    i32[0] = -2147483648
    u32[0] = 4294967295
    i64[0] = 2**63 - 1
    u64[0] = 2**64 - 1
    i64[1] = (2**70) // (2**10)  # a large intermediate is fine when the result fits
    i64[2] = i32[1] + 3000000000  # a literal too large for i32 widens the operation to i64
    u32[1] = u32[2] + -1  # ... and a negative one next to an unsigned type, to a signed one
    f32[0] = math.inf


def test_literals_that_fit_and_weak_typing_are_unchanged():
    i32[1] = 7
    u32[2] = 5
    literals_that_fit()
    assert i32[0] == -2147483648 and u32[0] == 4294967295 and u64[0] == 2**64 - 1
    assert i64[0] == 2**63 - 1 and i64[1] == 2**60 and i64[2] == 3000000007
    assert u32[1] == 4 and f32[0] == np.inf


@qd.kernel
def typed_constants(big: qd.f32):
    i8[0] = qd.i32(300)  # a typed value wraps as at run time (numpy's astype)
    i32[0] = qd.f32(1e10)  # float to int saturates, folded or not
    i32[1] = big


def test_typed_constants_convert_as_at_run_time():
    typed_constants(1e10)
    assert i8[0] == 44 and i32[0] == i32[1] == 2147483647


# ---- strings and docstrings ---------------------------------------------------------------------

@qd.func
def documented(v):
    """A func's docstring."""
    return v + 1


@qd.func
def pick(v, mode):
    if qd.static(mode == "double"):
        return v * 2
    return v


@qd.kernel
def with_docstrings():
    """The kernel's docstring."""
    i32[0] = documented(1)
    i32[1] = pick(5, "double")
    if qd.static(MODE == "fast"):
        i32[2] = 3


def test_docstrings_and_compile_time_strings_are_accepted():
    with_docstrings()
    assert list(i32.to_numpy()[:3]) == [2, 10, 3]


def test_a_string_statement_is_an_error():
    @qd.kernel
    def k():
        i32[0] = 1
        "not a docstring"  # stray string

    e = compile_error(k)
    assert e.line == line_of("# stray string") and "a string is not a statement" in e.raw_message


def test_a_compile_time_comparison_that_python_refuses_is_an_error():
    @qd.kernel
    def k():
        i32[0] = 1 < "a"  # int < str

    e = compile_error(k)
    assert e.line == line_of("# int < str") and "compile-time comparison failed" in e.raw_message


# ---- qd.loop_config -----------------------------------------------------------------------------

def test_loop_config_rejects_unknown_keys_with_a_suggestion():
    @qd.kernel
    def k():
        qd.loop_config(serialise=True)  # misspelt
        for i in range(4):
            i32[i] = i

    e = compile_error(k)
    assert e.line == line_of("# misspelt") and e.col == SOURCE[e.line - 1].index("serialise") + 1
    assert "no option 'serialise' (did you mean 'serialize'?)" in e.raw_message
    with pytest.raises(TypeError):
        qd.loop_config(serialise=True)


@qd.kernel
def with_block_dim():
    qd.loop_config(block_dim=128)
    for i in range(4):
        i32[i] = i * 2


def test_loop_config_block_dim_is_accepted_and_kept_on_the_loop():
    from qdc.compiler.frontend.ast_to_ir import FrontEnd
    from qdc.compiler.jit.api import direct_options
    kir = FrontEnd(with_block_dim.fn, [], direct_options()).build()
    (loop,) = [s for s in kir.body.stmts if isinstance(s, ir.RangeFor)]
    assert loop.block_dim == 128 and not loop.serial
    with_block_dim()
    assert list(i32.to_numpy()) == [0, 2, 4, 6]


# ---- signature errors and warnings point at the user's source ------------------------------------

def test_signature_errors_point_at_the_parameter():
    @qd.kernel
    def missing(a: qd.f32, b):  # b unannotated
        i32[0] = 1

    @qd.kernel
    def star(*rest):  # star parameter
        i32[0] = 1

    for kernel, marker, name, message in [(missing, "# b unannotated", "b", "needs a type annotation"),
                                          (star, "# star parameter", "rest", "*args parameter")]:
        e = compile_error(kernel, 1.0, 2.0)
        line = line_of(marker)
        assert (e.filename, e.line, e.col) == (__file__, line, SOURCE[line - 1].index(f"{name})") + 1)
        assert message in e.raw_message and e.source_line == SOURCE[line - 1] + "\n"


def _warning_from_inside_qdc():
    """A function whose code lives in qdc's compiler folder that issues a warning from there."""
    namespace = {"warnings": warnings}
    path = os.path.join(os.path.dirname(kernel_mod.__file__), "a_pass.py")
    exec(compile("def warn():\n    warnings.warn('a pass warns about this kernel', UserWarning)\n",  # noqa: S102
                 path, "exec"), namespace)
    return namespace["warn"]


@qd.kernel
def warned_about():
    i32[0] = 1


def test_warnings_about_a_kernel_point_at_its_source_compiled_or_cached(monkeypatch, tmp_path):
    compile_kernel, warn = kernel_mod.compile_kernel, _warning_from_inside_qdc()

    def compile_and_warn(*args, **kwargs):
        warn()
        return compile_kernel(*args, **kwargs)

    monkeypatch.setattr(kernel_mod, "compile_kernel", compile_and_warn)
    for expect_cached in (False, True):
        qd.init(arch=qd.cpu, cache_dir=str(tmp_path))
        with pytest.warns(UserWarning, match="a pass warns") as record:
            compiled = kernel_of(warned_about).compile()
        assert compiled.from_cache == expect_cached
        assert (record[0].filename, record[0].lineno) == (__file__, warned_about.fn.__code__.co_firstlineno)


# ---- shapes, ndrange, .shape[k] ------------------------------------------------------------------

def test_numpy_integer_shapes_are_accepted_and_bad_shapes_refused():
    assert qd.field(qd.i32, shape=np.int64(3)).shape == (3,)
    assert qd.field(qd.i32, shape=(np.int32(2), 3)).shape == (2, 3)
    assert qd.ndarray(qd.f32, shape=np.array([2, 5])).shape == (2, 5)
    for bad in (2.5, (2, 3.0), -1, (4, -2), "ab", True):
        with pytest.raises(ValueError, match="shape"):
            qd.field(qd.i32, shape=bad)


def test_static_ndrange_of_floats_is_a_compile_error():
    @qd.kernel
    def k():
        for i in qd.static(qd.ndrange(0.1, 0.2)):  # float ndrange
            i32[0] = 1

    e = compile_error(k)
    assert e.line == line_of("# float ndrange") and e.col == SOURCE[e.line - 1].index("0.1") + 1
    assert "qd.ndrange() arguments must be integers" in e.raw_message
    with pytest.raises(TypeError, match="must be integers"):
        list(qd.ndrange(0.5))


def test_shape_index_out_of_range_names_the_parameter_and_its_ndim():
    @qd.kernel
    def k(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        a[0] = a.shape[2]  # out of range

    e = compile_error(k, np.zeros(3, np.float32))
    assert e.line == line_of("# out of range")
    assert "ndarray parameter 'a' has ndim 1: a.shape[2] is out of range" in e.raw_message


def test_block_dim_reaches_the_task_and_its_gradient():
    """qd.loop_config(block_dim=...) is kept through offloading (the GPU targets' launch policy reads
    it from the task) and on the adjoint task, and shows in the IR dump."""
    from qdc.compiler.frontend.ast_to_ir import FrontEnd
    from qdc.compiler.jit.api import direct_options
    from qdc.compiler.passes.pipeline import run_pipeline
    kir = FrontEnd(with_block_dim.fn, [], direct_options()).build()
    run_pipeline(kir)
    (task,) = kir.tasks
    assert task.block_dim == 128
    assert "block_dim=128" in ir.print_kernel(kir)
