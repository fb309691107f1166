"""The runtime's side of `qd.random`: the seed and the launch counter that each launch of a
kernel that draws finds in its ctx (runtime/contract/artifact.py, `random_slot`).

The counter counts the launches of such kernels since the runtime started (`qd.init`), so a
program that launches the same kernels in the same order draws the same numbers; kernels
that do not draw neither see nor advance it."""
from __future__ import annotations

from . import context

MAX_SEED = (1 << 64) - 1


class RandomStream:
    def __init__(self):
        self.seed = 0
        self.launches = 0

    def restart(self, seed: int) -> None:
        """Start again from launch 0 with `seed` (`qd.init(random_seed=...)`)."""
        check_seed(seed)
        self.seed, self.launches = seed, 0

    def invalidate(self) -> None:
        """A new runtime starts counting launches from 0 (context.on_reset)."""
        self.launches = 0

    def writer(self, slot: int):
        """`prepare(ctx)` for a kernel whose random words start at ctx word `slot`."""
        def prepare(ctx) -> None:
            ctx.words[slot] = self.seed
            ctx.words[slot + 1] = self.launches
            self.launches += 1
        return prepare


def check_seed(seed) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"random_seed must be an integer in [0, 2**64), got {seed!r}")


STREAM = RandomStream()
context.on_reset(STREAM)


def restart(seed: int) -> None:
    STREAM.restart(seed)
