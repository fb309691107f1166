"""Methods of fields that Quadrants also offers inside kernels, written in the kernel language as
Quadrants writes them: where a kernel or qd.func calls `x.fill(v)` on a field, the front end
inlines `fill(x, v)` (compiler/frontend/calls.py). At a kernel's top level its loop is a parallel
task, as any loop there is; inside a loop it runs serially."""
from __future__ import annotations

from .lang import func, grouped, template


@func
def fill(F: template(), val: template()):
    for I in grouped(F):
        F[I] = val
