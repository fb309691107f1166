"""`quadrants.lang`: the submodules programs reach (`impl`, `_template_mapper`); every other name
is qdc's (`quadrants.lang.kernel` is `qd.kernel`)."""
from . import impl, template_mapper as _template_mapper  # noqa: F401


def __getattr__(name):
    import qdc
    return getattr(qdc, name)
