"""`qd.graph.do_while` loops at launch (the launch path "graph_loops", launch_path.py): the
metadata lists each loop as [first task, end task, flag parameter] (runtime/contract/artifact.py);
a launch queues the tasks one by one and, after each pass of a loop's tasks, reads its flag
back (a 4-byte read that waits for the queued work) to decide whether to queue them again."""
from __future__ import annotations

import ctypes

import numpy as np

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
