"""Which element of a global an access touches, and whether two accesses can touch the same one.

Index expressions are compared through structural keys (IndexKeys): equal keys denote the same
element within one iteration. Where a key is affine — integer multiples of the task index and
of enclosing loop indices, plus a constant, plus terms that do not change while the task runs
(arguments, shapes, temporaries, reads of globals the kernel never writes) — accesses can also
be compared across iterations, as a compiler's dependence test does: for each way one
execution can follow another (a later iteration of the task, of an enclosing loop, or later in
the same iteration), some dimension must prove the two elements different. A ndrange's
flattened index counts as known when both accesses use the same `i // n` and `i % n` parts of it.

Every answer is conservative: "maybe the same element" unless proven otherwise.
"""
from __future__ import annotations

import functools

from .. import ir

TASK = ("task_index",)  # the key of the task's own index, whichever task


def buffer_key(target) -> tuple:
    if isinstance(target, ir.FieldRef):
        return ("field", target.name)
    if isinstance(target, ir.SharedRef):
        return ("shared", target.uid)
    return ("ndarray", target.arg_index, target.is_grad)


class IndexKeys:
    """Structural keys of index expressions: equal keys mean the same element in one iteration
    of the task. `written`: buffer keys the kernel writes (loads of them are opaque values)."""

    def __init__(self, written: set):
        self.written, self.memo = written, {}

    def of_ptr(self, ptr: ir.GlobalPtr) -> tuple:
        return tuple(self.of(i) for i in ptr.indices)

    def of(self, s) -> tuple:
        key = self.memo.get(s)
        if key is None:
            key = self.memo[s] = self._compute(s)
        return key

    def _compute(self, s) -> tuple:
        if isinstance(s, ir.LoopIndex):
            return TASK if isinstance(s.loop, ir.Task) else ("loop", id(s.loop))
        if isinstance(s, ir.Const):
            return ("const", s.type.name, s.value)
        if isinstance(s, ir.GlobalLoad) and buffer_key(s.ptr.target) not in self.written:
            return ("load", buffer_key(s.ptr.target), self.of_ptr(s.ptr))
        if isinstance(s, (ir.ArgLoad, ir.NdarrayShape, ir.TempLoad)) or s.PURE:
            return (type(s).__name__, s.type.name, tuple(repr(a) for a in s.attrs()),
                    tuple(self.of(o) for o in s.operands()))
        return ("value", id(s))  # a local, a load of a written global: may change anywhere


def loop_symbol(loop) -> tuple:
    return ("loop", id(loop))


def _is_symbol(part) -> bool:
    return part == TASK or (isinstance(part, tuple) and len(part) == 2 and part[0] == "loop")


def same_in_every_iteration(key) -> bool:
    """Does the index key denote one element whatever the task's iteration?"""
    return not mentions(key, TASK) and not opaque(key)


def mentions(key, symbol) -> bool:
    return key == symbol or any(isinstance(part, tuple) and mentions(part, symbol) for part in key)


def _symbols(key, out: set) -> set:
    if _is_symbol(key):
        out.add(key)
    else:
        for part in key:
            if isinstance(part, tuple):
                _symbols(part, out)
    return out


def opaque(key) -> bool:
    if isinstance(key, tuple) and len(key) == 2 and key[0] == "value":
        return True
    return any(isinstance(part, tuple) and opaque(part) for part in key)


# ---- affine forms -------------------------------------------------------------------------

class Affine:
    """sum(symbols[s] * s) + const + sum(invariant[k] * k) over integers."""
    __slots__ = ("symbols", "const", "invariant")

    def __init__(self, symbols=None, const=0, invariant=None):
        self.symbols, self.const, self.invariant = symbols or {}, const, invariant or {}

    def scaled(self, c: int) -> Affine:
        return Affine({s: c * v for s, v in self.symbols.items()}, c * self.const,
                      {k: c * v for k, v in self.invariant.items()})

    def plus(self, other: Affine) -> Affine:
        return Affine(_add_terms(self.symbols, other.symbols), self.const + other.const,
                      _add_terms(self.invariant, other.invariant))

    @property
    def is_constant(self) -> bool:
        return not self.symbols and not self.invariant


def _add_terms(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
        if out[k] == 0:
            del out[k]
    return out


@functools.lru_cache(maxsize=4096)  # a pure function of the key; keys repeat across access pairs
def affine(key) -> Affine | None:
    if _is_symbol(key):
        return Affine({key: 1})
    if key[0] == "const":
        value = key[2]
        return Affine(const=value) if isinstance(value, int) and not isinstance(value, bool) else None
    if key[0] in ("Binary", "Unary", "Cast"):
        form = _affine_op(key)
        if form is not None:
            return form
    if not _symbols(key, set()) and not opaque(key):
        return Affine(invariant={key: 1})  # the same value in every iteration of the task
    return None


def _affine_op(key) -> Affine | None:
    kind, type_name, attrs, args = key
    op = attrs[0].strip("'") if attrs else None
    if kind == "Cast":
        return affine(args[0]) if type_name[0] in "iu" and type_name != "u1" else None
    forms = [affine(a) for a in args]
    if None in forms:
        return None
    if kind == "Unary":
        return forms[0].scaled(-1) if op == "neg" else None
    a, b = forms
    if op == "add":
        return a.plus(b)
    if op == "sub":
        return a.plus(b.scaled(-1))
    if op == "mul" and (a.is_constant or b.is_constant):
        return b.scaled(a.const) if a.is_constant else a.scaled(b.const)
    return None


# ---- can two executions touch the same element? ---------------------------------------------
#
# A pattern constrains, for each loop symbol shared by both accesses, δ = (its value at the
# later access) - (its value at the earlier one): "zero", "pos" (>= 1), "nonzero"; a symbol
# not in the pattern is free. The accesses can meet under a pattern unless one dimension's
# equation `key_later = key_earlier` has no solution under it.

def may_meet_in_other_iteration(a_key: tuple, b_key: tuple, bounds: tuple | None = None) -> bool:
    """Can two different iterations of a parallel task touch one element, with these keys?
    `bounds`: the keys of the task's begin and end, if known."""
    if _apart_within(a_key, b_key, bounds):
        return False
    return _feasible(a_key, b_key, {TASK: "nonzero"})


def _apart_within(a_key: tuple, b_key: tuple, bounds: tuple | None) -> bool:
    """Does some dimension prove that no iteration of the range `bounds` (the keys of the task's
    begin and end) makes the two keys meet?"""
    return bounds is not None and any(_outside_the_range(x, y, *bounds) or _outside_the_range(y, x, *bounds)
                                      for x, y in zip(a_key, b_key))


def _outside_the_range(moving, fixed, begin, end) -> bool:
    """`moving` is the task index plus terms that do not change, `fixed` does not change: they
    meet only in the iteration i = fixed - (moving - i); is that one outside [begin, end)?
    (`out[i] = out[n] + ...` over range(n) reads an element no iteration writes.)"""
    lo = affine(begin)
    if end[0] == "Binary" and end[2] == ("'max'",) and end[3][1][:1] == ("const",) and lo is not None \
            and lo.is_constant and end[3][1][2] <= lo.const:
        end = end[3][0]  # max(E, c), c <= begin: past E is past the end, or no iteration runs
    m, f, hi = affine(moving), affine(fixed), affine(end)
    if None in (m, f, lo, hi) or m.symbols != {TASK: 1} or f.symbols or lo.symbols or hi.symbols:
        return False
    meeting = f.plus(Affine(const=m.const, invariant=m.invariant).scaled(-1))  # the one iteration
    past_end, before_begin = meeting.plus(hi.scaled(-1)), lo.plus(meeting.scaled(-1))
    return (not past_end.invariant and past_end.const >= 0) or (not before_begin.invariant and before_begin.const >= 1)


def may_follow_on_same_element(later, earlier, task: ir.Task) -> bool:
    """Can an execution of access `later` that follows one of `earlier` in task `task` (both
    in it) touch earlier's element? `later`/`earlier` have .stmt, .key, .positions and .bounds."""
    if _apart_within(later.key, earlier.key, later.bounds):
        return False  # no iteration of the task's range touches the other's element
    p = later.positions
    enclosing = set(p.loops[earlier.stmt])
    common = [loop for loop in p.loops[later.stmt] if loop in enclosing]
    patterns, same_iteration = [], {}
    if task.kind == "range_for":
        patterns.append({TASK: "pos" if task.serial else "nonzero"})  # another iteration of the task
        same_iteration[TASK] = "zero"
    for level, loop in enumerate(common):  # a later iteration of a shared loop
        pattern = dict(same_iteration)
        pattern.update({loop_symbol(outer): "zero" for outer in common[:level]})
        pattern[loop_symbol(loop)] = "pos"
        patterns.append(pattern)
    if p.pos[later.stmt] > p.pos[earlier.stmt]:  # later in the same iteration of every shared loop
        pattern = dict(same_iteration)
        pattern.update({loop_symbol(loop): "zero" for loop in common})
        patterns.append(pattern)
    return any(_feasible(later.key, earlier.key, pattern) for pattern in patterns)


def _feasible(later_key: tuple, earlier_key: tuple, pattern: dict) -> bool:
    if pattern.get(TASK) in ("pos", "nonzero") and _task_index_determined(later_key, earlier_key):
        return False
    return all(_dimension_feasible(a, b, pattern) for a, b in zip(later_key, earlier_key))


def _dimension_feasible(later_dim, earlier_dim, pattern: dict) -> bool:
    a, b = affine(later_dim), affine(earlier_dim)
    if a is None or b is None or a.invariant != b.invariant:
        return True
    delta = a.const - b.const
    moving = []  # (coefficient, constraint) of the symbols whose δ is not fixed at zero
    for symbol in set(a.symbols) | set(b.symbols):
        coef = a.symbols.get(symbol, 0)
        if coef != b.symbols.get(symbol, 0):
            return True  # different strides (or a loop only one access is in): not analysed
        constraint = pattern.get(symbol, "free")
        if constraint == "free":
            return True
        if constraint != "zero":
            moving.append((coef, constraint))
    if not moving:
        return delta == 0
    if len(moving) > 1:
        return True
    coef, constraint = moving[0]
    if delta % coef:
        return False
    step = -delta // coef
    return step >= 1 if constraint == "pos" else step != 0


def _task_index_determined(a_key: tuple, b_key: tuple) -> bool:
    """Do the dimensions both keys share, functions of the task index alone, pin the index down
    (equal elements then mean equal indices)? `i` itself, or `i // n` with `i % n`, recursively."""
    shared = {a for a, b in zip(a_key, b_key)
              if a == b and _symbols(a, set()) <= {TASK} and not opaque(a)}
    return _determines(shared, TASK, 0)


def _determines(shared: set, target, depth: int) -> bool:
    if target in shared:
        return True
    if depth > 8:
        return False
    for key in shared:
        if key[0] == "Binary" and key[2] == ("'mod'",) and key[3][0] == target:
            quotient = ("Binary", key[1], ("'floordiv'",), key[3])  # target = c * (target // c) + target % c
            if _determines(shared, quotient, depth + 1):
                return True
    return False
