"""Template arguments that cannot be walked to the end: a tuple or list that contains itself,
or one nested past MAX_TEMPLATE_NESTING, is a TypeError naming the kernel and the parameter
(direct mode and `qd.aot.instantiate`), never a RecursionError; nesting up to the limit and
containers shared between siblings compile and run."""
from __future__ import annotations

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver.templates import MAX_TEMPLATE_NESTING


@qd.kernel
def scale_by_first(t: qd.template(), a: qd.types.ndarray(dtype=qd.f32, ndim=1),
                   out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(a.shape[0]):
        out[i] = a[i] * t[0]


def _nested(value, depth: int):
    """(value, (value, (... (value,) ...))): `depth` tuples, one inside the next."""
    t = (value,)
    for _ in range(depth - 1):
        t = (value, t)
    return t


def _self_containing_list():
    x = [2.0]
    x.append(x)
    return x


def _tuple_through_a_list():
    inner = [2.0]
    outer = (2.0, inner)
    inner.append(outer)
    return outer


def _cycle_below_the_top():
    x = [2.0]
    x.append([1.0, [x]])
    return (2.0, x)


@pytest.mark.parametrize("make", [_self_containing_list, _tuple_through_a_list, _cycle_below_the_top],
                         ids=["list_in_itself", "tuple_through_a_list", "cycle_below_the_top"])
def test_an_argument_that_contains_itself_is_a_type_error_naming_the_parameter(make, rng):
    a = rng.standard_normal(8).astype(np.float32)
    out = np.zeros_like(a)
    with pytest.raises(TypeError, match=r"template argument 't' of kernel 'scale_by_first'.*contains itself"):
        scale_by_first(make(), a, out)
    scale_by_first((3.0,), a, out)  # the failed call left the kernel usable
    np.testing.assert_allclose(out, a * 3.0, rtol=1e-6)


def test_an_argument_nested_past_the_limit_is_a_type_error_naming_the_parameter(rng):
    a = rng.standard_normal(8).astype(np.float32)
    out = np.zeros_like(a)
    for depth in (MAX_TEMPLATE_NESTING + 1, 2000):
        with pytest.raises(TypeError, match=rf"template argument 't' of kernel 'scale_by_first'.*nested more "
                                            rf"than {MAX_TEMPLATE_NESTING} deep"):
            scale_by_first(_nested(1.5, depth), a, out)


def test_instantiate_refuses_the_same_arguments():
    with pytest.raises(TypeError, match=r"template argument 't' of kernel 'scale_by_first'.*contains itself"):
        qd.aot.instantiate(scale_by_first, t=_self_containing_list())
    with pytest.raises(TypeError, match=r"template argument 't' of kernel 'scale_by_first'.*nested more than"):
        qd.aot.instantiate(scale_by_first, t=_nested(1.5, 2000))


def test_nesting_up_to_the_limit_and_shared_containers_compile_and_run(rng):
    a = rng.standard_normal(16).astype(np.float32)
    s = float(rng.uniform(0.5, 2.0))
    out = np.zeros_like(a)
    scale_by_first(_nested(s, MAX_TEMPLATE_NESTING), a, out)
    np.testing.assert_allclose(out, a * np.float32(s), rtol=1e-6)
    shared = [s, s]  # the same list twice, side by side: repeated, not recursive
    scale_by_first((s, shared, (shared, shared)), a, out)
    np.testing.assert_allclose(out, a * np.float32(s), rtol=1e-6)
