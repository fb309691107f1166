"""`qd.ad.Tape(loss, grad_check=[fields])`: the recorded gradients checked against central
finite differences (docs/api.md, Autodiff).

While the Tape records, every field a recorded kernel touches and every array argument is
saved as it was before the first recorded launch that could change it (`StateSnapshot`). After
the backward pass, for each checked field the gradient of every element (at most
`MAX_ELEMENTS` per field: then a sample, always including the largest gradient) is compared
with (L(x + h) - L(x - h)) / (2h): each side restores the saved state, perturbs the one
element and replays the recorded forward launches. Everything is then put back as the Tape
left it (primal values and gradients), and a disagreement beyond the tolerance raises
GradCheckError naming the worst element: field, index, analytic and numeric values.

Step and tolerance follow the precision of the loss and the checked field: single precision
(f16/f32) steps by 1e-2 and allows 1e-2 relative error, double by 1e-6 and 1e-5; each also
allows the loss's rounding error amplified by the step (eps * |L| / h) and a floor relative
to the largest gradient checked, so that elements with a near-zero gradient do not fail on
noise. As in Quadrants, only the recorded kernel launches are replayed: Python-scope writes
made inside the Tape's body are not.
"""
from __future__ import annotations

import numpy as np

from qdc.runtime.contract.objects import FieldMarker as Field, NdarrayMarker as Ndarray

MAX_ELEMENTS = 64


class GradCheckError(AssertionError):
    """A recorded gradient disagrees with central finite differences."""


class _Precision:
    def __init__(self, step: float, rtol: float, eps: float):
        self.step, self.rtol, self.eps = step, rtol, eps


_SINGLE = _Precision(1e-2, 1e-2, float(np.finfo(np.float32).eps))
_DOUBLE = _Precision(1e-6, 1e-5, float(np.finfo(np.float64).eps))


def check_fields(fields, loss) -> list:
    """The grad_check list, validated: float fields (or qd.ndarrays) that have a gradient."""
    if not isinstance(fields, (list, tuple)):
        raise TypeError(f"Tape(grad_check=...) needs a list of fields, got {type(fields).__name__}")
    if loss is None:
        raise ValueError("Tape(grad_check=...) needs a loss to differentiate")
    for f in fields:
        if not isinstance(f, (Field, Ndarray)):
            raise TypeError(f"Tape(grad_check=...): {f!r} is not a qd field or ndarray")
        if not f.dtype.is_float:
            raise TypeError(f"Tape(grad_check=...): {_name(f)} holds {f.dtype}, which has no gradient")
        if f.grad is None:
            raise ValueError(f"Tape(grad_check=...): {_name(f)} has no gradient: create it with needs_grad=True")
    return list(fields)


def _name(a) -> str:
    return f"field '{a.name}'" if isinstance(a, Field) else f"qd.ndarray {a.dtype}{list(a.shape)}"


class StateSnapshot:
    """Fields and arrays as they were before the recorded launches changed them."""

    def __init__(self):
        self.saved: dict = {}  # id -> (array object, its contents)

    def save(self, a) -> None:
        if id(a) not in self.saved:
            self.saved[id(a)] = (a, _contents(a))

    def save_launch(self, kernel, args, kwargs) -> None:
        """Before a recorded launch: the fields it can touch and its array arguments."""
        for f in kernel.compile(args, kwargs=kwargs).field_objects:
            self.save(f)
        for a in [*args, *(kwargs or {}).values()]:
            if isinstance(a, (Field, Ndarray)) or isinstance(a, np.ndarray) and a.flags.writeable:
                self.save(a)  # (a kernel cannot write a read-only numpy array)

    def current(self) -> "StateSnapshot":
        """The same objects with their contents now."""
        now = StateSnapshot()
        for a, _ in self.saved.values():
            now.save(a)
        return now

    def restore(self) -> None:
        for a, contents in self.saved.values():
            _set_contents(a, contents)


def _contents(a) -> np.ndarray:
    return a.copy() if isinstance(a, np.ndarray) else a.to_numpy()


def _set_contents(a, contents: np.ndarray) -> None:
    if isinstance(a, np.ndarray):
        a[...] = contents
    else:
        a.from_numpy(contents)


def run_check(fields: list, loss, calls: list, initial: StateSnapshot) -> None:
    """Compare each field's recorded gradient with central differences; GradCheckError on the
    worst disagreement beyond tolerance. State is left as it was on entry."""
    final = initial.current()
    grads = {id(f): f.grad.to_numpy() for f in fields}
    final_grads = [(f.grad, f.grad.to_numpy()) for f in fields]
    worst = None  # (excess over tolerance, message)
    try:
        for f in fields:
            initial.save(f)  # a checked field no recorded kernel touched still gets restored
            worst = _check_one(f, grads[id(f)], loss, calls, initial, worst)
    finally:
        final.restore()
        for g, contents in final_grads:
            g.from_numpy(contents)
    if worst is not None:
        raise GradCheckError(worst[1])


def _check_one(f, analytic: np.ndarray, loss, calls, initial: StateSnapshot, worst):
    precision = _DOUBLE if f.dtype.nbytes >= 8 and loss.dtype.nbytes >= 8 else _SINGLE
    start = initial.saved[id(f)][1]
    flat_grad = analytic.reshape(-1).astype(np.float64)
    elements = _elements(flat_grad)
    results = []
    for k in elements:
        x0 = float(start.reshape(-1)[k])
        h = precision.step * max(1.0, abs(x0))
        values, points = [], []
        for sign in (1.0, -1.0):
            perturbed = start.copy()
            perturbed.reshape(-1)[k] = x0 + sign * h
            points.append(float(perturbed.reshape(-1)[k]))  # as the field's type holds it
            initial.restore()
            _set_contents(f, perturbed)
            for kernel, args, kwargs in calls:
                kernel.launch_unrecorded(args, kwargs)
            values.append(float(np.asarray(loss.to_numpy(), np.float64).reshape(-1)[0]))
        numeric = (values[0] - values[1]) / (points[0] - points[1])
        roundoff = 10 * precision.eps * max(abs(values[0]), abs(values[1]), 1.0) / h
        results.append((k, flat_grad[k], numeric, roundoff))
    scale = max([abs(a) for _, a, _, _ in results] + [0.0])
    for k, a, n, roundoff in results:
        tolerance = precision.rtol * (max(abs(a), abs(n)) + 0.1 * scale) + roundoff
        excess = abs(a - n) / tolerance if tolerance > 0 else (0.0 if a == n else np.inf)
        if excess > 1 and (worst is None or excess > worst[0]):
            index = tuple(int(i) for i in np.unravel_index(k, analytic.shape)) if analytic.ndim else ()
            worst = (excess, f"grad_check: {_name(f)}, element {index}: the recorded gradient is {a:.7g} but "
                             f"central finite differences give {n:.7g} (difference {abs(a - n):.3g}, tolerance "
                             f"{tolerance:.3g}; {len(elements)} of {flat_grad.size} elements checked)")
    return worst


def _elements(flat_grad: np.ndarray) -> list[int]:
    """Every element index, or a fixed sample of MAX_ELEMENTS with the largest gradient in it."""
    if flat_grad.size <= MAX_ELEMENTS:
        return list(range(flat_grad.size))
    largest = int(np.argmax(np.abs(flat_grad)))
    others = np.delete(np.arange(flat_grad.size), largest)
    chosen = np.random.default_rng(0).choice(others, MAX_ELEMENTS - 1, replace=False)
    return sorted([largest, *map(int, chosen)])
