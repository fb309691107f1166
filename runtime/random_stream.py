"""The runtime's side of `qd.random`: the seed and the launch counter that each launch of a
kernel that draws finds in its ctx (runtime/contract/artifact.py, `random_slot`).

The counter counts the launches of such kernels since the runtime started (`qd.init`), so a
program that launches the same kernels in the same order draws the same numbers; kernels
that do not draw neither see nor advance it.

A gradient launch draws again what the forward launch it differentiates drew (its forward sweep
recomputes the primal values, so a new draw would give the gradient of another function): a
Tape replays each recorded launch's counter (`replaying`), and a plain `kernel.grad()` takes
the counter of that kernel's last forward launch. A gradient launch does not advance the counter."""
from __future__ import annotations

from contextlib import contextmanager

from . import context

MAX_SEED = (1 << 64) - 1


class RandomStream:
    def __init__(self):
        self.seed = 0
        self.launches = 0
        self.last_forward: dict = {}  # kernel name -> the counter of its last forward launch
        self.replay = None  # the counter the next gradient launches draw with (a Tape's replay)

    def restart(self, seed: int) -> None:
        """Start again from launch 0 with `seed` (`qd.init(random_seed=...)`)."""
        check_seed(seed)
        self.seed, self.launches = seed, 0
        self.last_forward.clear()

    def invalidate(self) -> None:
        """A new runtime starts counting launches from 0 (context.on_reset)."""
        self.launches = 0
        self.last_forward.clear()

    @contextmanager
    def replaying(self, counter: int):
        """Gradient launches inside draw with `counter`, the forward launch's."""
        before, self.replay = self.replay, counter
        try:
            yield
        finally:
            self.replay = before

    def writer(self, slot: int, kernel: str, gradient: bool):
        """`prepare(ctx)` for kernel `kernel` (its gradient variant if `gradient`) whose random
        words start at ctx word `slot`."""
        def prepare(ctx) -> None:
            ctx.words[slot] = self.seed
            ctx.words[slot + 1] = self.launches
            self.last_forward[kernel] = self.launches
            self.launches += 1

        def prepare_gradient(ctx) -> None:
            counter = self.replay if self.replay is not None else self.last_forward.get(kernel)
            if counter is None:  # no forward launch to differentiate: a draw of its own
                counter = self.launches
                self.launches += 1
            ctx.words[slot] = self.seed
            ctx.words[slot + 1] = counter
        return prepare_gradient if gradient else prepare


def check_seed(seed) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"random_seed must be an integer in [0, 2**64), got {seed!r}")


STREAM = RandomStream()
context.on_reset(STREAM)


def restart(seed: int) -> None:
    STREAM.restart(seed)
