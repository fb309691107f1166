"""`qd.graph`: `while qd.graph.do_while(flag):` in a kernel (Quadrants' name and semantics).

The loop's body (top-level statements and parallel loops, as at the kernel's top level) runs,
then runs again while `flag[()]`, a 0-d i32 ndarray argument, is nonzero: a do-while whose
condition the body's tasks compute on the device. It may sit at the kernel's top level or
directly in another do_while body. The runtime replays the body's tasks from the host,
reading the flag after each pass (runtime/launcher.py); Quadrants' CUDA graphs do the same on
GPUs without conditional nodes.
"""
from __future__ import annotations


def do_while(condition):
    """`while qd.graph.do_while(condition):` inside a kernel (see the module docstring)."""
    raise RuntimeError("qd.graph.do_while can only be used as `while qd.graph.do_while(flag):` in a kernel")
