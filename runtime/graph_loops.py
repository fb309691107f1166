"""`qd.graph.do_while` loops at launch: the metadata lists each loop as [first task, end task,
flag parameter] (runtime/contract/artifact.py).

- Launch path "graph_loops" (launch_path.py), on every device: a launch queues the tasks one by
  one and, after each pass of a loop's tasks, reads its flag back (a 4-byte read that waits for
  the queued work) to decide whether to queue them again.
- "device_loops", a graph=True kernel where the device has conditional graph nodes (CUDA 12.4+,
  runtime/devices/cuda/conditional_graphs.py): one graph replay, the loops run on the device.
  A task whose thread slices are not fixed is launched on the grid cap when it is inside a loop
  (its trip count may change from pass to pass; its grid-stride loop reads its bound on the
  device) or reads a temporary, as graph=True kernels do."""
from __future__ import annotations

import ctypes

import numpy as np

from .contract import sizeexpr as se
from .device_copies import host_array


def loop_steps(loops: list, first: int, end: int) -> list:
    """Tasks [first, end) as steps: a task's index, or (flag, steps) for a do_while loop (the
    outermost starting at a task; the loops inside it among its steps)."""
    steps, i = [], first
    while i < end:
        starting = [r for r in loops if r[0] == i]
        if not starting:
            steps.append(i)
            i += 1
            continue
        outer = max(starting, key=lambda r: r[1])
        inside = [r for r in loops if r is not outer and outer[0] <= r[0] and r[1] <= outer[1]]
        steps.append((outer[2], loop_steps(inside, outer[0], outer[1])))
        loops = [r for r in loops if r is not outer and r not in inside]
        i = outer[1]
    return steps


class GraphLoops:
    """The launch of a kernel with do_while loops: a mixin of the launcher (runtime/launcher.py),
    whose ctx buffer, slices, error slot and device copies it uses."""

    def launch_loops(self, args: tuple) -> None:
        """`launch_tasks` of a kernel with qd.graph.do_while loops: a loop's tasks are queued
        again while its flag, read back after each pass, is nonzero."""
        slot = self.own_error_slot()
        self.run_steps(self.steps, args)
        self.watch_errors(slot)
        if self.sync_each_launch:
            self.device.sync()

    def launch_device_loops(self, args: tuple) -> None:
        """`launch_loops` as one replay of a graph whose loops are conditional nodes; the host
        loop where a flag has no device address (an array the device reads in place)."""
        flags = {}
        for flag in _flags(self.steps):
            address = self.flag_address(flag, args)
            if address is None:
                return self.launch_loops(args)
            flags[flag] = address
        slot = self.own_error_slot()
        slices, env = list(self.fixed_slices), None
        looped = _looped_tasks(self.steps)
        for i, fixed in enumerate(slices):
            if fixed is None:
                if i in looped or se.reads_temps(self.iterations[i]):
                    slices[i] = self.device.task_slices(self.meta.tasks[i].launch, None)
                else:
                    slices[i], env = self.slices_now(i, args, env)
        self.device.launch_graph_loops(self.loaded, ctypes.addressof(self.buf), slices, self.steps, flags)
        self.watch_errors(slot)
        if self.sync_each_launch:
            self.device.sync()

    def flag_address(self, index: int, args: tuple) -> int | None:
        """The device address of do_while flag `index` (a 0-d i32 ndarray argument)."""
        a = args[index]
        if hasattr(a, "allocation"):
            return a.allocation().ptr
        if self.copies is not None and index in self.copies.buffers:
            return self.copies.buffers[index].ptr
        return None

    def run_steps(self, steps: list, args: tuple) -> None:
        env, ctx = None, ctypes.addressof(self.buf)
        for step in steps:
            if isinstance(step, int):
                slices = self.fixed_slices[step]
                if slices is None:
                    slices, env = self.slices_now(step, args, env)
                self.device.launch_task(self.loaded, step, ctx, slices)
                continue
            flag, body = step
            while True:
                self.run_steps(body, args)
                if self.flag_value(flag, args) == 0:
                    break
            env = None  # temporaries the loop's tasks wrote are read anew

    def flag_value(self, index: int, args: tuple) -> int:
        """A do_while flag (0-d i32 ndarray argument `index`) as the queued tasks leave it."""
        a = args[index]
        word = np.zeros(1, np.int32)
        if hasattr(a, "allocation"):
            self.device.copy_to_host(a.allocation(), word)
        elif self.copies is not None and index in self.copies.buffers:
            self.device.copy_to_host(self.copies.buffers[index], word)
        else:
            self.device.sync()
            word[0] = host_array(a).reshape(-1)[0]
        return int(word[0])


def _flags(steps: list) -> list:
    """The flag parameters of the loops in `steps`, nested ones included."""
    out = []
    for step in steps:
        if not isinstance(step, int):
            out += [step[0]] + _flags(step[1])
    return out


def _looped_tasks(steps: list, inside: bool = False) -> set:
    """The tasks of `steps` that run inside a loop."""
    out = set()
    for step in steps:
        if isinstance(step, int):
            if inside:
                out.add(step)
        else:
            out |= _looped_tasks(step[1], True)
    return out
