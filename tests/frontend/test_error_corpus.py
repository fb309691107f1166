"""The error corpus: over a hundred bad kernels, each an error at a marked line, checked in
direct mode (calling the kernel raises QdcCompileError) and through `qdc build` (one run over
the whole corpus as one module: exit 1, every error printed, never a traceback).

Each expected error line in CORPUS carries `# <- KERNEL | SNIPPET | MESSAGE`: the kernel whose
error it is, the text the caret points at on that line, and a part of the message. Errors
inside a qd.func are marked in the func, under the name of the kernel that calls it.
"""
import importlib.util
import subprocess
import sys

import pytest

import qdc as qd

CORPUS = '''"""Bad kernels: each marks the line its error must point at with `# <- NAME | SNIPPET | MESSAGE`
(SNIPPET: where the caret goes on that line; MESSAGE: a part of the error message)."""
import numpy as np

import qdc as qd

x = qd.field(qd.f32, shape=8)
m = qd.field(qd.f32, shape=(4, 4))
n = qd.field(qd.i32, shape=())
a = qd.field(qd.i32, shape=4)
u = qd.field(qd.u32, shape=4)
b = qd.field(qd.i64, shape=4)
F1 = qd.types.ndarray(dtype=qd.f32, ndim=1)
P = qd.types.struct(a=qd.f32, v=qd.math.vec3)
pf = P.field(shape=4)
flags = qd.field(qd.u1, shape=4)
xg = qd.field(qd.f32, shape=4, needs_grad=True)
yg = qd.field(qd.f32, shape=(), needs_grad=True)
ARGS = {}  # kernel name -> arguments of the direct-mode call

def plain_python(v):
    return v + 1

@qd.func
def two_args(p, q):
    return p + q

@qd.func
def recurse(v):
    return recurse(v - 1)  # <- bad_recursion | recurse(v - 1) | recursion is not supported

@qd.func
def early_return_in_loop(v):
    for i in range(3):
        if i == v:
            return i  # <- bad_return_in_loop | return | return must be the last statement
    return -1

@qd.func
def undefined_in_func(v):
    return v + nowhere  # <- bad_undefined_in_func | nowhere | name 'nowhere' is not defined  # noqa: F821

@qd.kernel
def other_kernel():
    x[0] = 1.0

@qd.kernel
def bad_undefined_name():
    x[0] = undefined_thing + 1  # <- bad_undefined_name | undefined_thing | 'undefined_thing' is not defined  # noqa

@qd.kernel
def bad_local_of_if(v: qd.f32):
    if v > 0:
        w = v
    x[0] = w  # <- bad_local_of_if | w | name 'w' is not defined

ARGS["bad_local_of_if"] = (1.0,)

@qd.kernel
def bad_float_index():
    x[1.5] = 0.0  # <- bad_float_index | 1.5 | must be an integer

@qd.kernel
def bad_runtime_float_index(v: qd.f32):
    x[0] = m[1, v]  # <- bad_runtime_float_index | v] | must be an integer, got f32

ARGS["bad_runtime_float_index"] = (1.0,)

@qd.kernel
def bad_too_many_indices():
    x[0] = m[1, 2, 3]  # <- bad_too_many_indices | m[1, 2, 3] | has 2 dimension(s) but is indexed with 3

@qd.kernel
def bad_too_few_indices():
    m[1] = 0.0  # <- bad_too_few_indices | m[1] | has 2 dimension(s) but is indexed with 1

@qd.kernel
def bad_scalar_field_index():
    n[0] = 1  # <- bad_scalar_field_index | n[0] | with n[None]

@qd.kernel
def bad_list_comprehension():
    v = [j for j in range(n[None])]  # <- bad_list_comprehension | range(n[None]) | iterates over what the compiler knows

@qd.kernel
def bad_set_comprehension():
    v = {j for j in range(3)}  # <- bad_set_comprehension | {j for | set comprehensions are not supported

@qd.kernel
def bad_generator():
    x[0] = max((j for j in range(3)), 0)  # <- bad_generator | (j for | generator expressions are not supported

@qd.kernel
def bad_try():
    try:  # <- bad_try | try | try/except is not supported
        x[0] = 1.0
    except Exception:
        pass

@qd.kernel
def bad_with():
    with open("f"):  # <- bad_with | with | with-statements are not supported
        pass

@qd.kernel
def bad_lambda():
    f = lambda v: v + 1  # <- bad_lambda | lambda | lambda is not supported  # noqa: E731

@qd.kernel
def bad_class():
    class A:  # <- bad_class | class | class definitions are not supported
        pass

@qd.kernel
def bad_nested_def():
    def helper():  # <- bad_nested_def | def | nested function definitions are not supported
        return 1

@qd.kernel
def bad_global():
    global x  # <- bad_global | global | global/nonlocal declarations are not supported
    x[0] = 1.0

def make_nonlocal():
    count = 0

    @qd.kernel
    def bad_nonlocal():
        nonlocal count  # <- bad_nonlocal | nonlocal | global/nonlocal declarations are not supported
        count = 1

    return bad_nonlocal

bad_nonlocal = make_nonlocal()

@qd.kernel
def bad_star_call():
    t = 2.0
    x[0] = two_args(*t)  # <- bad_star_call | *t | only a vector, a matrix, a tuple or a 1-D numpy array

@qd.kernel
def bad_kwargs_call():
    x[0] = max(**{"a": 1})  # <- bad_kwargs_call | ** | argument unpacking

@qd.kernel
def bad_starred_target():
    p, *q = (1, 2, 3)  # <- bad_starred_target | p, *q | cannot unpack 3 value(s) into 2 name(s)

@qd.kernel
def bad_walrus():
    x[0] = (v := 2.0)  # <- bad_walrus | v := | assignment expressions (:=) are not supported

@qd.kernel
def bad_fstring():
    s = f"{x[0]}"  # <- bad_fstring | f"{ | f-strings are not supported

@qd.kernel
def bad_print():
    print(x)  # <- bad_print | x | print() cannot show a Field in a kernel

@qd.kernel
def bad_yield():
    yield x[0]  # <- bad_yield | yield | yield is not supported

@qd.kernel
def bad_slice():
    x[0] = x[1:3]  # <- bad_slice | 1:3 | field 'x' cannot be sliced in kernels

@qd.kernel
def bad_func_arity():
    x[0] = two_args(1.0)  # <- bad_func_arity | two_args( | missing a required argument: 'q'

@qd.kernel
def bad_intrinsic_arity():
    x[0] = qd.sin(1.0, 2.0)  # <- bad_intrinsic_arity | qd.sin( | sin() takes 1 argument(s), got 2

@qd.kernel
def bad_intrinsic_keyword():
    x[0] = qd.sqrt(v=2.0)  # <- bad_intrinsic_keyword | v=2.0 | sqrt() has no parameter 'v' (it takes x)

@qd.kernel
def bad_string_statement():
    """A docstring is fine."""
    x[0] = 1.0
    "but this string is not"  # <- bad_string_statement | "but | a string is not a statement

@qd.kernel
def bad_string_assigned():
    s = "text"  # <- bad_string_assigned | "text" | a string is not a kernel value

@qd.kernel
def bad_string_stored():
    x[0] = "text"  # <- bad_string_stored | "text" | a string is not a kernel value

@qd.kernel
def bad_wrapping_literal():
    a[0] = 3000000000  # <- bad_wrapping_literal | 3000000000 | integer literal 3000000000 does not fit in i32

@qd.kernel
def bad_negative_unsigned():
    u[0] = -1  # <- bad_negative_unsigned | -1 | integer literal -1 does not fit in u32

@qd.kernel
def bad_power_overflow():
    b[0] = 2**70  # <- bad_power_overflow | 2**70 | '2 ** 70' = 1180591620717411303424 does not fit in i64

@qd.kernel
def bad_shift_overflow():
    b[0] = 1 << 100  # <- bad_shift_overflow | 1 << 100 | does not fit in i64

@qd.kernel
def bad_huge_local():
    v = 2**64  # <- bad_huge_local | 2**64 | does not fit in 64 bits
    x[0] = v

@qd.kernel
def bad_huge_operand(v: qd.i64):
    b[0] = v + 2**64  # <- bad_huge_operand | v + 2**64 | does not fit in 64 bits

ARGS["bad_huge_operand"] = (1,)

@qd.kernel
def bad_float_too_large():
    x[0] = 1e40  # <- bad_float_too_large | 1e40 | too large for f32

@qd.kernel
def bad_cast_literal():
    a[0] = qd.cast(300, qd.u8)  # <- bad_cast_literal | 300 | integer literal 300 does not fit in u8

@qd.kernel
def bad_loop_config_key():
    qd.loop_config(serialise=True)  # <- bad_loop_config_key | serialise | (did you mean 'serialize'?)
    for i in range(4):
        a[i] = i

@qd.kernel
def bad_loop_config_positional():
    qd.loop_config(True)  # <- bad_loop_config_positional | qd.loop_config | takes keyword arguments only
    for i in range(4):
        a[i] = i

@qd.kernel
def bad_loop_config_block_dim():
    qd.loop_config(block_dim=0)  # <- bad_loop_config_block_dim | 0 | block_dim=...) must be a positive integer
    for i in range(4):
        a[i] = i

@qd.kernel
def bad_loop_config_alone():
    qd.loop_config(serialize=True)
    a[0] = 1  # <- bad_loop_config_alone | a[0] | must be followed directly by the for loop

@qd.kernel
def bad_raise():
    raise ValueError("no")  # <- bad_raise | raise | raise is not supported

@qd.kernel
def bad_del():
    v = 1
    del v  # <- bad_del | del | del is not supported

@qd.kernel
def bad_import():
    import math  # <- bad_import | import | import is not supported

@qd.kernel
def bad_dict_literal():
    d = {1: 2}  # <- bad_dict_literal | {1: 2} | dicts are not supported

@qd.kernel
def bad_set_literal():
    s = {1, 2}  # <- bad_set_literal | {1, 2} | sets are not supported

@qd.kernel
def bad_match(v: qd.i32):
    match v:  # <- bad_match | match | match statements are not supported
        case 1:
            x[0] = 1.0

ARGS["bad_match"] = (1,)

@qd.kernel
def bad_return_in_kernel():
    x[0] = 1.0
    return 1  # <- bad_return_in_kernel | return | returns a value but declares no return type

@qd.kernel
def bad_break_parallel():
    for i in range(8):
        if i > 3:
            break  # <- bad_break_parallel | break | break cannot leave a parallel loop

@qd.kernel
def bad_break_static(n: qd.i32):
    for i in qd.static(range(3)):
        if n > i:
            break  # <- bad_break_static | break | break in a qd.static loop (which is unrolled) must be decided

ARGS["bad_break_static"] = (1,)

@qd.kernel
def bad_for_else():
    for i in range(3):  # <- bad_for_else | for | for/else is not supported
        x[i] = 1.0
    else:
        x[0] = 0.0

@qd.kernel
def bad_while_else():
    i = 0
    while i < 3:  # <- bad_while_else | while | while/else is not supported
        i += 1
    else:
        x[0] = 0.0

@qd.kernel
def bad_kernel_call():
    other_kernel()  # <- bad_kernel_call | other_kernel() | kernel 'other_kernel' cannot be called from a kernel

@qd.kernel
def bad_open_call():
    x[0] = len(open("f"))  # <- bad_open_call | open( | 'open' is not a qd.func or a qd intrinsic

@qd.kernel
def bad_assign_field():
    x = 1.0  # <- bad_assign_field | x = | cannot assign to 'x', which is a field  # noqa: F841

@qd.kernel
def bad_iterable_choice(n: qd.i32):
    for i in range(4) if n > 0 else range(2):  # <- bad_iterable_choice | n > 0 | can only be chosen at compile time
        x[i] = 1.0

ARGS["bad_iterable_choice"] = (1,)

@qd.kernel
def bad_matmul(v: qd.f32):
    x[0] = v @ v  # <- bad_matmul | v @ v | both operands of '@' must be vectors or matrices

ARGS["bad_matmul"] = (1.0,)

@qd.kernel
def bad_is_runtime(v: qd.f32):
    x[0] = v is None  # <- bad_is_runtime | v is None | comparison 'is' needs compile-time operands

ARGS["bad_is_runtime"] = (1.0,)

@qd.kernel
def bad_range_step(s: qd.i32):
    for i in range(0, 8, s):  # <- bad_range_step | s) | range() step must be a compile-time positive integer
        x[i] = 1.0

ARGS["bad_range_step"] = (2,)

@qd.kernel
def bad_range_float_bound():
    for i in range(2.5):  # <- bad_range_float_bound | 2.5 | range() bounds must be integers
        x[0] = 1.0

@qd.kernel
def bad_static_runtime(v: qd.f32):
    if qd.static(v > 0):  # <- bad_static_runtime | v > 0 | qd.static() needs a value known at compile time
        x[0] = v

ARGS["bad_static_runtime"] = (1.0,)

@qd.kernel
def bad_static_range_runtime(k: qd.i32):
    for i in qd.static(range(k)):  # <- bad_static_range_runtime | range(k) | known at compile time
        x[i] = 1.0

ARGS["bad_static_range_runtime"] = (3,)

@qd.kernel
def bad_tuple_loop():
    for v in (1, 2):  # <- bad_tuple_loop | (1, 2) | wrap it in qd.static
        x[v] = 0.0

@qd.kernel
def bad_int_loop():
    for v in 5:  # <- bad_int_loop | 5 | for loops iterate over
        x[v] = 0.0

@qd.kernel
def bad_static_float_ndrange():
    for i in qd.static(qd.ndrange(0.1, 0.2)):  # <- bad_static_float_ndrange | 0.1 | arguments must be integers
        x[0] = 1.0

@qd.kernel
def bad_ndrange_triple():
    for i in qd.ndrange((0, 1, 2)):  # <- bad_ndrange_triple | (0, 1, 2) | (begin, end) pairs
        x[0] = 1.0

@qd.kernel
def bad_shape_index(v: F1):
    v[0] = v.shape[2]  # <- bad_shape_index | 2] | ndarray parameter 'v' has ndim 1: v.shape[2] is out of range

ARGS["bad_shape_index"] = (np.zeros(3, np.float32),)

@qd.kernel
def bad_field_shape_index():
    x[0] = m.shape[5]  # <- bad_field_shape_index | 5] | field 'm' has ndim 2

@qd.kernel
def bad_missing_annotation(v):  # <- bad_missing_annotation | v) | parameter 'v' of kernel 'bad_missing_annotation' needs
    x[0] = v

ARGS["bad_missing_annotation"] = (1.0,)

@qd.kernel
def bad_star_parameter(*v):  # <- bad_star_parameter | v) | is a *args parameter
    x[0] = 1.0

ARGS["bad_star_parameter"] = (1.0,)

@qd.kernel
def bad_annotation(v: str):  # <- bad_annotation | v: | has unsupported annotation
    x[0] = 1.0

ARGS["bad_annotation"] = ("s",)

@qd.kernel
def bad_unindexed_field():
    x[0] = m  # <- bad_unindexed_field | m | must be indexed to be used as a value

@qd.kernel
def bad_runtime_attribute(v: qd.f32):
    x[0] = v.real  # <- bad_runtime_attribute | v.real | has no attribute 'real'

ARGS["bad_runtime_attribute"] = (1.0,)

@qd.kernel
def bad_field_attribute():
    x[0] = x.size  # <- bad_field_attribute | x.size | field has no attribute 'size'

@qd.kernel
def bad_field_grad():
    x.grad[0] = 1.0  # <- bad_field_grad | x.grad | has no .grad

@qd.kernel
def bad_ndarray_grad(v: qd.types.ndarray(dtype=qd.f32, ndim=1, needs_grad=False)):
    v.grad[0] = 1.0  # <- bad_ndarray_grad | v.grad | has no .grad

ARGS["bad_ndarray_grad"] = (np.zeros(3, np.float32),)

@qd.kernel
def bad_struct_member():
    x[0] = pf[0].w  # <- bad_struct_member | pf[0].w | has no member 'w'; its members are a, v

@qd.kernel
def bad_struct_constructor_member():
    s = P(a=1.0, w=2.0)  # <- bad_struct_constructor_member | w=2.0 | has no member 'w'
    x[0] = s.a

@qd.kernel
def bad_struct_member_shape():
    s = P(a=1.0)
    s.v = qd.Vector([1.0, 2.0])  # <- bad_struct_member_shape | qd.Vector | of shape (2,) to a vector of shape (3,)
    x[0] = s.a

@qd.kernel
def bad_struct_member_type():
    pf[0].a = qd.Vector([1.0, 2.0, 3.0])  # <- bad_struct_member_type | qd.Vector | to a scalar (f32)

@qd.kernel
def bad_random_dtype():
    x[0] = qd.random(qd.u1)  # <- bad_random_dtype | qd.random | random() needs a float or integer qd type

@qd.kernel
def bad_random_vector_dtype():
    x[0] = qd.random(dtype=qd.math.vec3)  # <- bad_random_vector_dtype | qd.random | got vec3

@qd.kernel
def bad_stop_grad_integer():
    n[None] = qd.stop_grad(n[None])  # <- bad_stop_grad_integer | n[None]) | qd.stop_grad() of a non-float value (i32)

@qd.kernel
def bad_atomic_mul_bool():
    qd.atomic_mul(flags[0], True)  # <- bad_atomic_mul_bool | flags[0] | qd.atomic_mul needs a numeric target, got u1

@qd.kernel
def product_of_xg():
    for i in xg:
        qd.atomic_mul(yg[None], xg[i])  # <- bad_atomic_mul_gradient | qd.atomic_mul | on 'yg' cannot be differentiated

def bad_atomic_mul_gradient():
    product_of_xg.grad()

@qd.kernel
def takes_a_struct(s: P) -> qd.f32:  # called with bad arguments: test_bad_arguments
    return s.a + s.v.sum()

@qd.kernel
def bad_float_bitwise(v: qd.f32):
    x[0] = v & 1  # <- bad_float_bitwise | v & 1 | bitwise operator needs integer operands

ARGS["bad_float_bitwise"] = (1.0,)

@qd.kernel
def bad_float_shift(v: qd.f32):
    x[0] = v << 1  # <- bad_float_shift | v << 1 | shift operators need integer operands

ARGS["bad_float_shift"] = (1.0,)

@qd.kernel
def bad_float_invert(v: qd.f32):
    x[0] = ~v  # <- bad_float_invert | ~v | ~ needs an integer operand

ARGS["bad_float_invert"] = (1.0,)

@qd.kernel
def bad_unpack_count():
    p, q = 1, 2, 3  # <- bad_unpack_count | p, q | cannot unpack 3 value(s) into 2 name(s)

@qd.kernel
def bad_tuple_value():
    x[0] = (1.0, 2.0)  # <- bad_tuple_value | (1.0, 2.0) | a tuple cannot be used as a scalar value

@qd.kernel
def bad_tuple_into_variable():
    v = 1.0
    if x[0] > 0:
        v = (1.0, 2.0)  # <- bad_tuple_into_variable | v = | cannot assign a tuple to the run-time variable 'v'

@qd.kernel
def bad_recursion():
    x[0] = recurse(3.0)

@qd.kernel
def bad_return_in_loop():
    x[0] = early_return_in_loop(2)

@qd.kernel
def bad_undefined_in_func():
    x[0] = undefined_in_func(2.0)

@qd.kernel
def bad_annotated_local():
    v: 3 = 1.0  # <- bad_annotated_local | 3 | a variable annotation must be a qd type

@qd.kernel
def bad_cast_type(v: qd.f32):
    x[0] = qd.cast(v, 3)  # <- bad_cast_type | 3) | qd.cast() needs a qd type

ARGS["bad_cast_type"] = (1.0,)

@qd.kernel
def bad_atomic_target():
    qd.atomic_add(1, 2)  # <- bad_atomic_target | 1, | the target of an atomic operation

@qd.kernel
def bad_loop_targets():
    for i, j in range(4):  # <- bad_loop_targets | i, j | the loop has 2 target(s) but iterates over 1 dimension(s)
        x[i] = 1.0

@qd.kernel
def bad_loop_0d_field():
    for i in n:  # <- bad_loop_0d_field | n: | cannot loop over 0-d field
        x[0] = 1.0

@qd.kernel
def bad_len_0d_field():
    x[0] = len(n)  # <- bad_len_0d_field | len(n) | len() of 0-d field

@qd.kernel
def bad_constant_division():
    a[0] = 1 // 0  # <- bad_constant_division | 1 // 0 | constant expression failed

@qd.kernel
def bad_constant_math():
    x[0] = qd.sqrt(-1.0)  # <- bad_constant_math | qd.sqrt | constant expression failed

@qd.kernel
def bad_field_condition():
    if x:  # <- bad_field_condition | x: | a field or ndarray is not a condition
        x[0] = 1.0

@qd.kernel
def bad_ellipsis():
    x[0] = ...  # <- bad_ellipsis | ... | constant Ellipsis is not supported

@qd.kernel
def bad_compile_time_compare():
    x[0] = 1 < "a"  # <- bad_compile_time_compare | 1 < "a" | compile-time comparison failed

@qd.kernel
def bad_tuple_index():
    t = (1, 2)
    x[0] = t[5]  # <- bad_tuple_index | 5] | index 5 is out of range for a tuple of 2 element(s)

@qd.kernel
def bad_keyword_only(*, v: qd.f32):  # <- bad_keyword_only | v: | is keyword-only
    x[0] = v

@qd.kernel
def bad_kwargs_parameter(**v):  # <- bad_kwargs_parameter | v) | is a **kwargs parameter
    x[0] = 1.0

@qd.kernel
def bad_string_annotation(v: "not_a_type"):  # <- bad_string_annotation | v: | cannot be evaluated  # noqa
    x[0] = 1.0

ARGS["bad_string_annotation"] = (1.0,)

@qd.kernel
def bad_annotated_wrap():
    v: qd.i32 = 3000000000  # <- bad_annotated_wrap | 3000000000 | does not fit in i32
    a[0] = v

@qd.kernel
def bad_augmented_wrap():
    a[0] += 3000000000  # <- bad_augmented_wrap | 3000000000 | does not fit in i32

@qd.kernel
def bad_type_call_wrap():
    a[0] = qd.i8(200)  # <- bad_type_call_wrap | 200 | integer literal 200 does not fit in i8

@qd.kernel
def bad_huge_range():
    for i in range(10**20):  # <- bad_huge_range | range( | does not fit in i64
        a[0] = 1

@qd.kernel
def bad_ndrange_field():
    for i in qd.ndrange(x):  # <- bad_ndrange_field | x) | qd.ndrange() arguments must be integers
        x[i] = 1.0

@qd.kernel
def bad_range_as_value():
    x[0] = range(3)  # <- bad_range_as_value | range(3) | can only be the iterable of a for loop

@qd.kernel
def bad_complex_constant():
    x[0] = 1j  # <- bad_complex_constant | 1j | constant 1j is not supported

@qd.kernel
def bad_none_value():
    x[0] = None  # <- bad_none_value | None | NoneType value cannot be used

@qd.kernel
async def bad_async_kernel():  # <- bad_async_kernel | async | a kernel must be a plain function definition
    x[0] = 1.0

@qd.kernel
def bad_subscript_runtime():
    x[0] = x[0][0]  # <- bad_subscript_runtime | x[0][0] | is not subscriptable

@qd.kernel
def bad_attribute_assign():
    v = x[0]
    v.foo = 1  # <- bad_attribute_assign | v.foo | cannot assign to an attribute

@qd.kernel
def bad_undefined_module_attribute():
    x[0] = qd.no_such(1)  # <- bad_undefined_module_attribute | qd.no_such | module 'qdc' has no attribute
'''


def parse_markers(text: str) -> dict:
    """{kernel: (line, col, message)} from the `# <-` markers of `text` (1-based line and col)."""
    markers = {}
    for number, line in enumerate(text.splitlines(), 1):
        if "  # <- " not in line:
            continue
        code, marker = line.split("  # <- ", 1)
        name, snippet, message = marker.split("  # noqa")[0].split(" | ")
        assert name not in markers and snippet in code, (name, snippet)
        markers[name] = (number, code.index(snippet) + 1, message)
    return markers


MARKERS = parse_markers(CORPUS)


def test_the_corpus_is_large_and_every_kernel_is_marked():
    kernels = {line.split("def ", 1)[1].split("(")[0] for line in CORPUS.splitlines()
               if line.lstrip().startswith(("def bad_", "async def bad_"))}
    assert kernels == set(MARKERS) and len(kernels) >= 50


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.py"
    path.write_text(CORPUS, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(corpus_file):
    spec = importlib.util.spec_from_file_location("qdc_error_corpus", corpus_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expected_header(path, name: str) -> tuple[str, str]:
    """The `file:line:col: error:` prefix of kernel `name`'s error and the source line shown after it."""
    line, col, _ = MARKERS[name]
    return f"{path}:{line}:{col}: error:", CORPUS.splitlines()[line - 1]


@pytest.mark.parametrize("name", sorted(MARKERS))
def test_direct_mode(corpus, corpus_file, name):
    line, col, message = MARKERS[name]
    with pytest.raises(qd.QdcCompileError) as info:
        getattr(corpus, name)(*corpus.ARGS.get(name, ()))
    e = info.value
    assert (e.filename, e.line, e.col) == (str(corpus_file), line, col), str(e)
    assert message in e.raw_message, str(e)
    header, source_line = expected_header(corpus_file, name)
    assert str(e) == f"{header} {e.raw_message}\n{source_line}\n{' ' * (col - 1)}^"
    assert "internal compiler error" not in str(e)


# Bad arguments to the corpus's good kernels: errors naming kernel, parameter and what is wrong.
BAD_ARGUMENTS = [
    ("takes_a_struct", ({"a": 1.0},), KeyError, "kernel 'takes_a_struct', argument 's': expected a "
     "struct(a: f32, v: vector(3, f32)): member 'v' missing from the dict given (its keys: 'a')"),
    ("takes_a_struct", ({"a": 1.0, "v": [1, 2, 3], "w": 0},), KeyError, "the dict given has no such member(s) 'w'"),
    ("takes_a_struct", ({"a": "one", "v": [1, 2, 3]},), TypeError, "kernel 'takes_a_struct', argument 's', element .a"),
    ("takes_a_struct", ({"a": 1.0, "v": [1, 2]},), ValueError, "argument 's', member 'v': expected a vector(3, f32)"),
]


@pytest.mark.parametrize("name,args,error,message", BAD_ARGUMENTS)
def test_bad_arguments(corpus, name, args, error, message):
    with pytest.raises(error) as info:
        getattr(corpus, name)(*args)
    assert message in str(info.value)


def test_qdc_build(corpus_file, tmp_path):
    r = subprocess.run([sys.executable, "-m", "qdc.cli.main", "build", str(corpus_file), "--cache",
                        str(tmp_path / "cache"), "-j", "1"], capture_output=True, text=True)
    output = r.stdout + r.stderr
    assert r.returncode == 1, output
    assert "Traceback" not in output and "internal compiler error" not in output, output
    for name in MARKERS:
        header, source_line = expected_header(corpus_file, name)
        assert f"{header} " in output, (name, output[-3000:])
        after = output.split(f"{header} ", 1)[1].split("\n")
        assert after[1] == source_line, (name, after[:3])
    assert f"{len(MARKERS)} failed" in output, output[-500:]
