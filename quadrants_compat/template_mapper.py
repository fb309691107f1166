"""`quadrants.lang._template_mapper`: programs set `__builtins__["__debug__"]` on it to turn
Quadrants' debug checks of template arguments on or off. qdc's checks of template arguments are
always on; the module's builtins are a private copy, so that setting them changes nothing else."""
import builtins as _builtins

__builtins__ = dict(vars(_builtins))  # noqa: A001
