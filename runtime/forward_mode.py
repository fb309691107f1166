"""Forward mode at run time: `FwdMode`, as `qd.ad.FwdMode` and `qdc.runtime.FwdMode`.

    with FwdMode(loss=y, param=x, seed=[...]):
        compute()          # runs as a Jacobian-vector product: y.dual = dy/dx · seed

As in Quadrants: `param` is a field (or qd.ndarray) with `needs_dual=True`; `seed` may be left
out only when it holds one element (then it is [1.0]); on entry every dual of a field is
zeroed (`clear_gradients`, the default) and `param.dual` is set to the seed; on exit the seed
is cleared and the duals keep their values. While the body runs, a kernel call launches the
kernel's forward_ad variant: entering stubs every kernel function (kernel_function.py,
`observe_calls`), so that the direct-mode kernel (compiler/jit/forward.py) and the prebuilt
one (loader.py) both see the call and launch that variant. A kernel without such a variant
(built ahead of time, it touches no dual) runs as it is: no tangent passes through it.

In a forward_ad kernel an ndarray's dual takes its gradient word (compiler/autodiff/
forward_mode.py): `dual_arguments` hands the launcher a view of each array whose gradient is
its dual.
"""
from __future__ import annotations

import numpy as np

from .fields import DUAL_FIELDS, Field, Ndarray
from .kernel_function import observe_calls, stop_observing_calls

active = None  # the FwdMode whose `with` body runs, if any


class FwdMode:
    """`with FwdMode(loss=y, param=x, seed=None, clear_gradients=True):` (see the module
    docstring). `loss`: a field or qd.ndarray with needs_dual, or a list of them."""

    def __init__(self, loss, param, seed=None, clear_gradients: bool = True):
        losses = list(loss) if isinstance(loss, (list, tuple)) else [loss]
        for what, value in [("loss", v) for v in losses] + [("param", param)]:
            _check_dual(what, value)
        self.loss, self.param, self.clear_gradients = losses, param, clear_gradients
        self.seed = _seed(param, seed)
        self.entered = False

    def __enter__(self):
        global active
        if self.entered:
            raise RuntimeError("a FwdMode can be entered only once")
        if active is not None:
            raise RuntimeError("FwdModes cannot be nested")
        self.entered = True
        if self.clear_gradients:
            for f in list(DUAL_FIELDS):
                f.dual.fill(0)
            for v in self.loss:
                v.dual.fill(0)
        self.param.dual.from_numpy(self.seed)
        observe_calls()
        active = self
        return self

    def __exit__(self, exc_type, exc, tb):
        global active
        active = None
        stop_observing_calls()
        self.param.dual.fill(0)  # the seed is cleared, as Quadrants does; the outputs' duals stay


def _check_dual(what: str, value) -> None:
    if not isinstance(value, (Field, Ndarray)):
        raise TypeError(f"FwdMode({what}=...) needs a qd field or qd.ndarray, got {type(value).__name__}")
    if not value.dtype.is_float:
        raise TypeError(f"FwdMode({what}=...): {value._what()} holds {value.dtype}; forward mode needs floats")
    if getattr(value, "dual", None) is None:
        raise ValueError(f"FwdMode({what}=...): {value._what()} has no dual: create it with needs_dual=True")


def _seed(param, seed) -> np.ndarray:
    """The seed as param.dual's contents (row-major, a vector element's components last): [1.0]
    by default for a one-element param."""
    shape = getattr(param, "storage_shape", param.shape)
    size = int(np.prod(shape, dtype=np.int64))
    if seed is None:
        if size != 1:
            raise ValueError(f"FwdMode: param {param._what()} has {size} elements, so seed= must say which "
                             f"direction to differentiate in: a list of {size} numbers (e.g. a 1 at the "
                             f"element of interest and 0 elsewhere)")
        seed = [1.0]
    values = np.asarray(seed, dtype=np.float64).ravel()
    if values.size != size:
        raise ValueError(f"FwdMode: seed has {values.size} values, param {param._what()} has {size} elements")
    return values.reshape(shape).astype(param.dtype.np_dtype)


# ---- launching ---------------------------------------------------------------------------------

def dual_arguments(meta, args: tuple, kwargs: dict | None) -> tuple[tuple, dict | None]:
    """`args`/`kwargs` for forward_ad kernel `meta`: each qd.ndarray with a dual as a view whose
    gradient word is its dual. An array with a dual where the kernel was built without one
    (ahead of time: a needs_grad=None parameter had no argument to follow) is refused, since
    its tangent would be ignored."""
    index = {a.name: a.first for a in meta.arguments}  # a vector argument has several records
    args = tuple(_dual_argument(meta, meta.arguments[i].first if i < len(meta.arguments) else len(meta.params), a)
                 for i, a in enumerate(args))
    if kwargs:
        kwargs = {name: _dual_argument(meta, index[name], a) if name in index else a for name, a in kwargs.items()}
    return args, kwargs


def _dual_argument(meta, i: int, a):
    if i >= len(meta.params) or not isinstance(a, Ndarray):
        return a
    p = meta.params[i]
    if p.kind != "ndarray":
        return a
    if a.dual is not None:
        if p.needs_grad is None and p.dtype[0] == "f":
            raise ValueError(f"kernel '{meta.name}', argument '{p.name}': this forward-mode kernel was built ahead of "
                             f"time without a dual for '{p.name}' (an ndarray parameter's dual follows the argument, "
                             f"and there was none to follow), so its tangent would be ignored; pass an array "
                             f"without needs_dual, or run the kernel in direct mode")
        return _DualView(a)
    if p.needs_grad:
        raise ValueError(f"kernel '{meta.name}', argument '{p.name}': forward mode needs its dual: pass a "
                         f"qd.ndarray created with needs_dual=True")
    return a


class _DualView(Ndarray):
    """An ndarray's memory with its dual where the launcher binds a gradient."""

    def __init__(self, array: Ndarray):  # the array's description; its memory through `allocation`
        self.__dict__.update(array.__dict__)
        self._array = array
        self.needs_grad, self.grad = True, array.dual
        self.needs_dual, self.dual = False, None

    def allocation(self):
        return self._array.allocation()
