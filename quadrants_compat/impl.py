"""`quadrants.lang.impl`: the runtime object Quadrants programs reach (`impl.get_runtime()`) and
the materialization step they hook (`impl.PyQuadrants.materialize`, runtime/lifecycle.py).

Installing the compatibility layer makes `PyQuadrants.materialize` the lifecycle's hook, looked
up on the class at each materialization, so that a program replacing it (`impl.PyQuadrants.
materialize = my_materialize`, calling the original inside) has its function run then; `clear`
runs at `qd.reset()`/`qd.init()`, when the fields are re-created on the new device.
"""
from __future__ import annotations


from qdc.runtime import lifecycle


class _Program:
    """`get_runtime().prog`: what programs call on Quadrants' program object."""

    def synchronize(self) -> None:
        import qdc.runtime
        qdc.runtime.sync()

    def config(self):
        return get_runtime().config


class PyQuadrants:
    """`impl.get_runtime()`: the active runtime's options as Quadrants names them
    (`default_fp`, `default_ip`, `prog`), and the materialization step."""

    def __init__(self):
        self.materialized = False
        self.prog = _Program()

    @property
    def config(self):
        from qdc.compiler.jit.api import direct_options
        return direct_options()

    @property
    def default_fp(self):
        return self.config.default_fp

    @property
    def default_ip(self):
        return self.config.default_ip

    def materialize(self) -> None:
        """Allocate the fields declared since the last materialization (qdc allocates each on its
        first use, so this only marks the step done)."""
        self.materialized = True
        lifecycle.done()

    def clear(self) -> None:
        self.materialized = False

    def sync(self) -> None:
        self.prog.synchronize()


_runtime = PyQuadrants()


def get_runtime() -> PyQuadrants:
    return _runtime


def _materialize_hook() -> None:
    runtime = get_runtime()
    type(runtime).materialize(runtime)  # looked up now: programs replace it


def _clear_hook() -> None:
    runtime = get_runtime()
    type(runtime).clear(runtime)


def current_cfg():
    """The options of the last `qd.init` (Quadrants' config: `.arch`, `.debug`, ...)."""
    return get_runtime().config


def get_max_shared_memory_bytes(*, is_lowerbound_ok: bool = False) -> int:
    """Bytes of block-shared memory a block may use on the active arch (0 on the CPU)."""
    from qdc.runtime import context
    arch = context.current().arch
    limits = {"cpu": 0, "cuda": 48 * 1024, "vulkan": 16 * 1024, "metal": 32 * 1024, "amdgpu": 64 * 1024}
    return limits[arch]


def field(dtype, shape=(), **options):
    import qdc
    return qdc.field(dtype, shape, **options)


def ndarray(dtype, shape, **options):
    import qdc
    return qdc.ndarray(dtype, shape, **options)


def install_hooks() -> None:
    lifecycle.set_hook(_materialize_hook, _clear_hook)


__all__ = ["PyQuadrants", "get_runtime", "current_cfg", "get_max_shared_memory_bytes", "field", "ndarray"]
