"""Which way a kernel's launches go, chosen once when its launcher is made (runtime/launcher.py),
and why: `qdc inspect` shows both.

On a device that runs a whole kernel in one synchronous foreign call (capabilities.fused_launch:
the CPU), fastest first:
- python_entry: the kernel library's Python entry takes the arguments as they are, checks and
  binds every one and launches, in one builtin call (runtime/devices/cpu/numpy_binding.py);
- native_binding: one foreign call whose entry binds the numpy arrays itself; scalars are
  packed in Python;
- fused: one foreign call; every argument bound in Python, as launch hooks (adstack sizing,
  debug checks, the print buffer, qd.random's counter) read the bound words before the call.
Elsewhere each task is launched on its own (Device.launch_task), its errors read at sync:
- device_loops: a graph=True kernel with qd.graph.do_while loops on a device with conditional
  graph nodes (CUDA 12.4+): one graph replay, each loop a device-side WHILE node;
- graph_loops: a kernel with qd.graph.do_while loops elsewhere: task by task, each loop's tasks
  queued again while its flag, read back after every pass, is nonzero;
- graph: `@qd.kernel(graph=True)` on a device with graphs: every task replayed as one graph;
- fixed_tasks: every task's thread slices known when the launcher is made and nothing to watch:
  a launch is only the task launches;
- tasks: the general case: trip counts evaluated at every launch, hooks around it.
"""
from __future__ import annotations

from dataclasses import dataclass

PATHS = ("python_entry", "native_binding", "fused", "device_loops", "graph_loops", "graph", "fixed_tasks", "tasks")


@dataclass(frozen=True)
class LaunchPath:
    name: str  # one of PATHS
    why: str

    def __str__(self) -> str:
        return f"{self.name}: {self.why}"


def choose_launch_path(device, hooked_by: list, graph: bool, binding, python_entry, slices_fixed: bool,
                       graph_loops: bool = False) -> LaunchPath:
    """The path of a launcher on `device`: `hooked_by` names what put launch hooks around it
    (empty: none), `graph` is `@qd.kernel(graph=True)`, `binding` / `python_entry` what the
    kernel's library offers on this device (None: nothing), `slices_fixed` whether every task's
    thread slices are known without the arguments, `graph_loops` whether the kernel has
    qd.graph.do_while loops."""
    hooks = f"launch hooks ({', '.join(hooked_by)})" if hooked_by else ""
    if graph_loops:
        why_not = device.device_loops() if graph else "the kernel is not graph=True"
        if why_not is None:
            return LaunchPath("device_loops", "qd.graph.do_while in a graph=True kernel: one graph replay, each loop "
                                              "a conditional WHILE node")
        return LaunchPath("graph_loops", f"qd.graph.do_while: task by task, a loop's tasks queued again while its "
                                         f"flag, read back after each pass, is nonzero ({why_not})")
    if device.capabilities.fused_launch:
        if python_entry is not None:
            return LaunchPath("python_entry", "the kernel's library checks and binds every argument and launches, "
                                              "in one builtin call")
        if binding is not None:
            return LaunchPath("native_binding", "one foreign call whose entry binds numpy arrays itself (the library "
                                                "has no Python entry for these parameters or this Python)")
        why = f"{hooks} read the arguments' words before the call" if hooks else \
            "the kernel's library binds no arguments itself"
        return LaunchPath("fused", f"one foreign call runs every task, arguments bound in Python: {why}")
    if graph and device.has_graphs:
        return LaunchPath("graph", "graph=True: every task replayed as one graph")
    unfixed = []  # what keeps a launch from being only its task launches
    if not slices_fixed:
        unfixed.append("a trip count is evaluated at every launch")
    if hooks:
        unfixed.append(hooks)
    if device.sync_each_launch:
        unfixed.append("a sync after every launch (QDC_CPU_LAUNCH=tasks)")
    no_graphs = f" (graph=True, but the {device.arch} device has no graphs)" if graph else ""
    if not unfixed:
        return LaunchPath("fixed_tasks", f"task by task, every task's thread slices fixed when loaded, nothing to "
                                         f"watch{no_graphs}")
    return LaunchPath("tasks", "task by task: " + "; ".join(unfixed) + no_graphs)
