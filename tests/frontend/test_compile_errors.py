"""Everything outside the kernel language is a QdcCompileError naming file:line:col, followed by
the source line and a caret (docs/api.md, Writing kernels) -- never an internal traceback.

Each offending line below carries a marker comment `# E<n>`; the expected column is where the
given snippet starts on that line. (A `break` outside any loop cannot be written at all:
Python rejects it when the module is compiled, so the loop cases tested are the ones Python
accepts and qdc does not: inside a qd.static loop and in a parallel loop.)
"""
import pathlib

import pytest

import qdc as qd

SOURCE = pathlib.Path(__file__).read_text(encoding="utf-8").splitlines()

x = qd.field(qd.f32, shape=8)
m = qd.field(qd.f32, shape=(4, 4))


def plain_python(v):
    return v + 1


@qd.func
def two_args(a, b):
    return a + b


@qd.func
def recursive(v):
    return recursive(v - 1)  # E17


@qd.func
def return_in_loop(v):
    for i in range(3):
        if i == v:
            return i  # E18
    return -1


@qd.func
def return_then_code(v):
    return v  # E19
    v += 1  # noqa (deliberately unreachable)


@qd.func
def bad_name_inside_func(v):
    return v + not_defined_in_func  # E20  # noqa: F821


@qd.kernel
def other_kernel():
    x[0] = 1.0


def location(marker: str, snippet: str) -> tuple[int, int]:
    """(line, col), both 1-based, of `snippet` on the line marked `# <marker>`."""
    hits = [i for i, text in enumerate(SOURCE) if text.rstrip().endswith(f"# {marker}") or f"# {marker} " in text]
    assert len(hits) == 1, marker
    text = SOURCE[hits[0]]
    assert snippet in text, (marker, snippet)
    return hits[0] + 1, text.index(snippet) + 1


def check(kernel, marker: str, snippet: str, message: str, args=()):
    with pytest.raises(qd.QdcCompileError) as info:
        kernel(*args)
    e = info.value
    line, col = location(marker, snippet)
    assert (e.filename, e.line, e.col) == (__file__, line, col), str(e)
    assert message in e.raw_message, str(e)
    assert str(e) == (f"{__file__}:{line}:{col}: error: {e.raw_message}\n"
                      f"{SOURCE[line - 1]}\n{' ' * (col - 1)}^")
    assert "Traceback" not in str(e) and "internal compiler error" not in str(e)


def test_comprehension_over_a_run_time_range():
    @qd.kernel
    def k(m: qd.i32):
        v = [j for j in range(m)]  # E1

    check(k, "E1", "range(m)", "a comprehension iterates over what the compiler knows", args=(3,))


def test_try():
    @qd.kernel
    def k():
        try:  # E2
            x[0] = 1.0
        except Exception:
            pass

    check(k, "E2", "try", "try/except is not supported")


def test_with():
    @qd.kernel
    def k():
        with open("f"):  # E3
            pass

    check(k, "E3", "with", "with-statements are not supported")


def test_class():
    @qd.kernel
    def k():
        class A:  # E4
            pass

    check(k, "E4", "class", "class definitions are not supported")


def test_lambda():
    @qd.kernel
    def k():
        f = lambda v: v + 1  # E5  # noqa: E731

    check(k, "E5", "lambda", "lambda is not supported")


def test_undefined_name():
    @qd.kernel
    def k():
        x[0] = undefined_thing + 1  # E6  # noqa: F821

    check(k, "E6", "undefined_thing", "name 'undefined_thing' is not defined")


def test_a_plain_python_function_is_inlined_like_a_func():
    """docs/api.md: a plain Python function whose source is available is inlined like a qd.func."""
    @qd.kernel
    def k():
        x[0] = plain_python(1.5)

    k()
    assert x[0] == 2.5


def test_calling_a_python_function_without_source():
    namespace: dict = {}
    exec("def no_source(v):\n    return v + 1\n", namespace)  # noqa: S102
    no_source = namespace["no_source"]

    @qd.kernel
    def k():
        x[0] = no_source(1.0)  # E7

    check(k, "E7", "no_source(", "'no_source' is not a qd.func")


def test_calling_a_kernel_from_a_kernel():
    @qd.kernel
    def k():
        other_kernel()  # E8

    check(k, "E8", "other_kernel()", "kernel 'other_kernel' cannot be called from a kernel")


def test_wrong_func_arity():
    @qd.kernel
    def k():
        x[0] = two_args(1.0)  # E9

    check(k, "E9", "two_args(", "call to qd.func 'two_args': missing a required argument: 'b'")


def test_float_index():
    @qd.kernel
    def k():
        x[1.5] = 0.0  # E10

    check(k, "E10", "1.5", "index into field")


def test_runtime_float_index():
    @qd.kernel
    def k(v: qd.f32):
        x[0] = m[1, v]  # E11

    check(k, "E11", "v]", "must be an integer, got f32", args=(1.0,))


def test_wrong_number_of_indices():
    @qd.kernel
    def k():
        m[1] = 0.0  # E12

    check(k, "E12", "m[1]", "has 2 dimension(s) but is indexed with 1")


def test_assigning_a_field():
    @qd.kernel
    def k():
        x = 1.0  # E13  # noqa: F841

    check(k, "E13", "x =", "cannot assign to 'x', which is a field")


def test_break_inside_a_static_loop_under_a_runtime_if():
    @qd.kernel
    def k(n: qd.i32):
        for i in qd.static(range(3)):
            if n > i:
                break  # E14

    check(k, "E14", "break", "break in a qd.static loop (which is unrolled) must be decided at compile time",
          args=(1,))


def test_break_in_a_parallel_loop():
    @qd.kernel
    def k():
        for i in range(8):
            if i > 3:
                break  # E15

    check(k, "E15", "break", "break cannot leave a parallel loop")


def test_return_in_a_kernel():
    @qd.kernel
    def k():
        for i in range(8):
            x[i] = 1.0
        return 1  # E16

    check(k, "E16", "return", "returns a value but declares no return type")


def test_recursion():
    @qd.kernel
    def k():
        x[0] = recursive(3.0)

    check(k, "E17", "recursive(v - 1)", "recursion is not supported")


def test_return_inside_a_loop():
    @qd.kernel
    def k():
        x[0] = return_in_loop(2)

    check(k, "E18", "return", "return must be the last statement")


def test_return_followed_by_code():
    @qd.kernel
    def k():
        x[0] = return_then_code(2.0)

    check(k, "E19", "return", "return must be the last statement")


def test_error_inside_a_func_points_into_the_func():
    @qd.kernel
    def k():
        x[0] = bad_name_inside_func(2.0)

    check(k, "E20", "not_defined_in_func", "name 'not_defined_in_func' is not defined")


def test_non_constant_range_step():
    @qd.kernel
    def k(s: qd.i32):
        for i in range(0, 8, s):  # E21
            x[i] = 1.0

    check(k, "E21", "s)", "range() step must be a compile-time positive integer", args=(2,))


def test_negative_range_step_outside_qd_static():
    @qd.kernel
    def k():
        for i in range(7, 0, -1):  # E29
            x[i] = 1.0

    check(k, "E29", "-1)", "range() step must be a compile-time positive integer")


def test_static_on_a_runtime_value():
    @qd.kernel
    def k(v: qd.f32):
        if qd.static(v > 0):  # E22
            x[0] = v

    check(k, "E22", "v > 0", "qd.static() needs a value known at compile time", args=(1.0,))


def test_variable_local_to_an_if_body():
    @qd.kernel
    def k(v: qd.f32):
        if v > 0:
            w = v
        x[0] = w  # E23

    check(k, "E23", "w", "name 'w' is not defined", args=(1.0,))


def test_loop_over_a_tuple_needs_static():
    @qd.kernel
    def k():
        for v in (1, 2):  # E24
            x[v] = 0.0

    check(k, "E24", "(1, 2)", "wrap it in qd.static")


def test_loop_config_must_precede_a_for():
    @qd.kernel
    def k():
        qd.loop_config(serialize=True)
        x[0] = 1.0  # E25

    check(k, "E25", "x[0]", "qd.loop_config() must be followed directly by the for loop")


def test_a_loop_over_a_run_time_choice():
    @qd.kernel
    def k(n: qd.i32):
        for i in range(4) if n > 0 else range(2):  # E26
            pass

    check(k, "E26", "n > 0", "a loop's iterable can only be chosen at compile time", args=(1,))


def test_unsupported_operator():
    @qd.kernel
    def k(v: qd.f32):
        x[0] = v @ v  # E27

    check(k, "E27", "v @ v", "both operands of '@' must be vectors or matrices", args=(1.0,))


def test_is_comparison():
    @qd.kernel
    def k(v: qd.f32):
        x[0] = v is None  # E28

    check(k, "E28", "v is None", "comparison 'is' needs compile-time operands", args=(1.0,))
