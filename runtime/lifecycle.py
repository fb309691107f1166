"""The moment fields are materialized, as Quadrants programs observe it.

Quadrants allocates the fields declared since its last materialization in one step, run before
the next kernel is compiled and before a Python-scope access to a new field, and programs hook
that step (Genesis defers fills of fields to it). qdc allocates each field on its first use, so
there is nothing to do for itself; but when a materialization hook is installed (the Quadrants
compatibility layer's `quadrants.lang.impl.PyQuadrants.materialize`), creating a field marks a
materialization as pending, and the next launch, Python-scope access of a field or ndarray, or
`qd.sync()` runs the hook first.

A pending materialization sends every kernel back through its slow path (the stub of
kernel_function.py) once, so the launch code itself never tests for it.
"""
from __future__ import annotations

_hook = None        # callable of no arguments, or None: nobody observes materializations
_clear_hook = None  # called when the runtime is replaced (qd.init, qd.reset)
_pending = False    # fields were created since the last materialization
# Called when a materialization becomes pending: kernel_function.py's, which sends every kernel
# through its slow path (registered there, so that this module imports nothing).
_stub_kernels = None


def on_pending(stub_kernels) -> None:
    global _stub_kernels
    _stub_kernels = stub_kernels


def set_hook(hook, clear=None) -> None:
    """Run `hook()` at each materialization from now on, and `clear()` when the runtime is
    replaced (None: stop)."""
    global _hook, _clear_hook, _pending
    _hook, _clear_hook = hook, clear
    _pending = hook is not None


def runtime_replaced() -> None:
    """`qd.init`/`qd.reset`: the fields come back on the new device, materialized anew."""
    global _pending
    if _hook is None:
        return
    if _clear_hook is not None:
        _clear_hook()
    _pending = True
    if _stub_kernels is not None:
        _stub_kernels()


def fields_created() -> None:
    """A field was declared: materialize before the next launch or host access."""
    global _pending
    if _hook is None or _pending:
        return
    _pending = True
    if _stub_kernels is not None:
        _stub_kernels()


def materialize_pending() -> None:
    """Run the hook if fields were created since the last materialization (it may create and
    fill fields itself: those are materialized by the accesses they make, not again here)."""
    global _pending
    if _pending:
        _pending = False
        _hook()


def done() -> None:
    """The hook materialized (called by it): nothing is pending."""
    global _pending
    _pending = False
