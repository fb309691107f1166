"""A compile keeps Python's cycle collector to the objects it makes (driver/kernel.py): objects
alive before it are frozen while it runs, and only then."""
import gc

import qdc as qd
from qdc.compiler.driver import kernel as compiling
from qdc.compiler.jit.api import direct_options
from qdc.compiler.jit.kernel import kernel_of


@qd.kernel
def scale(a: qd.types.ndarray(dtype=qd.f32, ndim=1), factor: qd.f32):
    for i in a:
        a[i] = a[i] * factor


def _build():
    opts = direct_options()
    compiling.compile_kernel(kernel_of(scale).fn, kernel_of(scale).params_for(opts), opts)


def _compile(seen: list):
    real = compiling._compile

    def watching(*args, **kwargs):
        seen.append(gc.get_freeze_count())
        return real(*args, **kwargs)
    return watching


def test_objects_alive_before_a_compile_are_frozen_during_it_and_released_after(monkeypatch):
    seen = []
    monkeypatch.setattr(compiling, "_compile", _compile(seen))
    assert gc.get_freeze_count() == 0
    _build()
    assert seen and seen[0] > 0
    assert gc.get_freeze_count() == 0


def test_a_freeze_made_elsewhere_is_left_alone(monkeypatch):
    seen = []
    monkeypatch.setattr(compiling, "_compile", _compile(seen))
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        _build()
        assert seen == [frozen] and gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
