"""Program-order facts about one task body, for deciding what the reverse sweep may recompute.

Statements are numbered in pre-order; a statement with blocks spans the numbers of everything
inside it. "May run after" questions are answered conservatively (a statement in the other
branch of an `if` counts as running in between): a false "yes" only costs a snapshot.
"""
from __future__ import annotations

from .. import ir


class Positions:
    def __init__(self, body: ir.Block):
        self.pos: dict = {}    # statement -> pre-order number
        self.end: dict = {}    # statement -> last number inside it (itself when it has no blocks)
        self.loops: dict = {}  # statement -> enclosing RangeFor/While statements (outermost first)
        self.blocks: dict = {}  # statement -> the blocks it is nested in (outermost first)
        self._next = 0
        self._number(body, (), ())

    def _number(self, block: ir.Block, loops: tuple, blocks: tuple) -> None:
        blocks = blocks + (block,)
        for s in block.stmts:
            self.pos[s] = self._next
            self._next += 1
            self.loops[s], self.blocks[s] = loops, blocks
            inner = loops + (s,) if isinstance(s, (ir.RangeFor, ir.While)) else loops
            for b in s.blocks():
                self._number(b, inner, blocks)
            self.end[s] = self._next - 1

    def dominates(self, first: ir.Stmt, then: ir.Stmt) -> bool:
        """Does every execution of `then` follow one of `first` in the same block instance?"""
        return self.pos[first] < self.pos[then] and first.block in self.blocks[then]

    def may_run_after(self, later: ir.Stmt, earlier: ir.Stmt) -> bool:
        """Can `later` execute after `earlier` within one iteration of the task?"""
        return self.pos[later] > self.pos[earlier] or bool(set(self.loops[later]) & set(self.loops[earlier]))

    def runs_between(self, s: ir.Stmt, start: ir.Stmt, stop: ir.Stmt) -> bool:
        """Can `s` execute after `start` and no later than the end of `stop`, in the same
        dynamic instance of `start` (`start` precedes `stop`, its block encloses `stop`)?
        That is: between them in program order, or anywhere in a loop that encloses `stop`
        but not `start` (earlier iterations of it run in between)."""
        if self.pos[start] < self.pos[s] <= self.end[stop]:
            return True
        outer = set(self.loops[start])
        return any(loop not in outer and self.pos[loop] < self.pos[s] <= self.end[loop]
                   for loop in self.loops[stop])
