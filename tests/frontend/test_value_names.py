"""Names the front end binds to their values instead of local variables (a name assigned by one
statement, a qd.func parameter never assigned): no local, the same results; and the names it
keeps as variables because something may write or index them as one."""
import re

import numpy as np

import qdc as qd
from qdc.compiler.commands.inspect import inspect_ir


def _locals(text: str) -> list:
    return re.findall(r"alloca '(\w+)'", text)


@qd.func
def scaled(v, s):  # neither assigned: both bound to the arguments
    return v * s + s


@qd.func
def bump(t: qd.template()):  # writes the caller's variable
    t = t + 1.0


@qd.func
def zero_first(v):  # writes its own copy of the vector
    v[0] = 0.0
    return v


def test_names_assigned_once_and_read_only_parameters_are_their_values():
    x = qd.field(qd.f32, shape=8)

    @qd.kernel
    def k():
        for i in x:
            a = x[i] * 2.0
            u = qd.math.vec3(a, a + 1.0, x[i])
            b = 0.0
            b = scaled(a, u[1]) + u.sum()  # b assigned twice: a variable
            x[i] = b + a

    assert _locals(inspect_ir(k, after="type_check")) == ["b"]
    xs = np.arange(8, dtype=np.float32)
    x.from_numpy(xs)
    k()
    a = xs * np.float32(2)
    u1 = a + np.float32(1)
    np.testing.assert_allclose(x.to_numpy(), a * u1 + u1 + (a + u1 + xs) + a, rtol=1e-6)


def test_names_written_through_calls_or_indexed_at_run_time_stay_variables():
    x = qd.field(qd.f32, shape=8)
    j = qd.field(qd.i32, shape=8)

    @qd.kernel
    def k():
        for i in x:
            t = x[i]
            bump(t)  # a qd.template() parameter: the func assigns t itself
            v = qd.math.vec4(t, t + 1.0, t + 2.0, t + 3.0)
            w = zero_first(v)  # the func's copy, not v
            acc = 0.0
            for s in qd.static(range(2)):
                c = v[s] * 2.0  # assigned once in the source, once per unrolled iteration
                acc += c
            x[i] = v[j[i] % 4] + w[0] + v[0] + acc  # v indexed at run time

    text = inspect_ir(k, after="type_check")
    assert {"t", "v", "c"} <= set(_locals(text))
    xs = np.arange(8, dtype=np.float32)
    js = np.array([5, 2, 7, 0, 1, 3, 6, 4], np.int32)
    x.from_numpy(xs)
    j.from_numpy(js)
    k()
    t = xs + np.float32(1)
    v = np.stack([t, t + 1, t + 2, t + 3], axis=1)
    expect = v[np.arange(8), js % 4] + 0 + v[:, 0] + (v[:, 0] * 2 + v[:, 1] * 2)
    np.testing.assert_allclose(x.to_numpy(), expect, rtol=1e-6)
