"""Lowering of the statements whose meaning ends with the autodiff transforms: `StopGrad`
becomes its operand and `Random` becomes integer arithmetic that every target has.

A draw is Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
SC'11) of a 128-bit counter under a 64-bit key:

    counter = (iteration index low, iteration index high, launch counter low, draw number)
    key     = (seed low, seed high ^ launch counter high ^ task number * 0x9E3779B9)

The iteration index is the task's loop index, the iteration's number from 0 (0 in a serial
task), so a stream depends on the seed, the launch order and the iteration, never on the
thread, the block size or the backend.
Draws that run at most once per iteration (outside any loop nested in the task) are numbered
by their call site; draws inside nested loops continue from there through a per-iteration
counter. The multiplications' high halves are built from 16-bit pieces, in u32 arithmetic
only, because Metal has no 64-bit integers.
"""
from __future__ import annotations

from qdc.runtime.contract import types as T

from .. import ir

PHILOX_ROUNDS = 10
PHILOX_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
PHILOX_WEYL = (0x9E3779B9, 0xBB67AE85)  # the key's increments between rounds
TASK_SALT = 0x9E3779B9
_MASK32 = 0xFFFFFFFF


def lower_intrinsics(k: ir.KernelIR) -> bool:
    """Replace every `StopGrad` by its operand and expand every `Random`; True if any was found."""
    changed = _drop_stop_grads(k)
    for number, task in enumerate(k.tasks):
        changed = _expand_task(k, task, number) or changed
    return changed


def _drop_stop_grads(k: ir.KernelIR) -> bool:
    markers = [s for s in ir.walk(k.body) if isinstance(s, ir.StopGrad)]
    if not markers:
        return False
    mapping = {}
    for s in markers:
        x = s.x
        while x in mapping:  # stop_grad(stop_grad(v))
            x = mapping[x]
        mapping[s] = x
    ir.replace_uses(k.body, mapping)
    for s in markers:
        s.block.stmts.remove(s)
    return True


def _expand_task(k: ir.KernelIR, task: ir.Task, number: int) -> bool:
    draws = [s for s in ir.walk(task.body) if isinstance(s, ir.Random)]
    for block in (task.prologue, task.chunk_init, task.chunk_final):
        stray = next((s for s in ir.walk(block) if isinstance(s, ir.Random)), None)
        if stray is not None:
            raise AssertionError(f"kernel '{k.name}': qd.random() outside a task body at {stray.loc}")
    if not draws:
        return False
    once = [d for d in draws if not _inside_loop(d, task)]
    site = {d: i for i, d in enumerate(once)}
    counter = None  # the per-iteration count of draws in nested loops, when there are any
    head = _Emitter(task.body, 0)
    if len(once) < len(draws):
        counter = head.emit(ir.Alloca(T.u32, "random_draws"))
        head.emit(ir.LocalStore(counter, head.u32(len(once))))
    state = [head.emit(ir.RandomState(w)) for w in range(ir.RANDOM_STATE_WORDS)]
    index = _index_words(head, task)
    salted = head.xor(head.xor(state[1], state[3]), head.u32(number * TASK_SALT & _MASK32))
    key = (state[0], salted)
    mapping = {}
    for d in draws:
        at = _Emitter(d.block, d.block.stmts.index(d))
        if d in site:
            draw = at.u32(site[d])
        else:
            draw = at.emit(ir.LocalLoad(counter))
            at.emit(ir.LocalStore(counter, at.binary("add", draw, at.u32(1))))
        words = philox(at, (index[0], index[1], state[2], draw), key, 2 if d.type.bits == 64 else 1)
        mapping[d] = _convert(at, words, d.type)
        d.block.stmts.remove(d)
    ir.replace_uses(task.body, mapping)
    return True


def _inside_loop(s: ir.Stmt, task: ir.Task) -> bool:
    block = s.block
    while block is not task.body:
        owner = block.parent
        if isinstance(owner, (ir.RangeFor, ir.While)):
            return True
        block = owner.block
    return False


def _index_words(at: _Emitter, task: ir.Task) -> tuple:
    """The iteration index as two u32 words, the high one as the sign-extended 64-bit index
    has it (so i32 and i64 indices give the same words)."""
    if task.kind == "serial" or task.index is None:
        return at.u32(0), at.u32(0)
    index = task.index
    t = index.type
    low = at.emit(ir.Cast(index, T.u32)) if t is not T.u32 else index
    if t.bits == 64:
        high = at.emit(ir.Cast(at.binary("shr", index, at.const(32, t)), T.u32))
    elif t.kind == "int":
        negative = at.emit(ir.Binary("lt", index, at.const(0, t), T.u1))
        high = at.emit(ir.Select(negative, at.u32(_MASK32), at.u32(0)))
    else:
        high = at.u32(0)
    return low, high


def philox(at: _Emitter, counter: tuple, key: tuple, count: int) -> list:
    """The first `count` u32 words of Philox-4x32-10 of `counter` under `key`."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(PHILOX_ROUNDS):
        if r:
            k0 = at.binary("add", k0, at.u32(PHILOX_WEYL[0]))
            k1 = at.binary("add", k1, at.u32(PHILOX_WEYL[1]))
        hi0, lo0 = _mul_hi_lo(at, c0, PHILOX_MULTIPLIERS[0])
        hi1, lo1 = _mul_hi_lo(at, c2, PHILOX_MULTIPLIERS[1])
        c0, c1, c2, c3 = at.xor(at.xor(hi1, c1), k0), lo1, at.xor(at.xor(hi0, c3), k1), lo0
    return [c0, c1][:count]


def _mul_hi_lo(at: _Emitter, x, multiplier: int) -> tuple:
    """(high, low) u32 halves of the 64-bit product x * multiplier, from 16-bit pieces."""
    m_lo, m_hi = at.u32(multiplier & 0xFFFF), at.u32(multiplier >> 16)
    x_lo = at.binary("bit_and", x, at.u32(0xFFFF))
    x_hi = at.binary("shr", x, at.u32(16))
    low_low, low_high = at.binary("mul", x_lo, m_lo), at.binary("mul", x_lo, m_hi)
    high_low, high_high = at.binary("mul", x_hi, m_lo), at.binary("mul", x_hi, m_hi)
    sixteen, piece = at.u32(16), at.u32(0xFFFF)
    middle = at.binary("add", at.binary("shr", low_low, sixteen),
                       at.binary("add", at.binary("bit_and", low_high, piece), at.binary("bit_and", high_low, piece)))
    high = at.binary("add", high_high, at.binary("add", at.binary("shr", low_high, sixteen),
                                                  at.binary("add", at.binary("shr", high_low, sixteen),
                                                            at.binary("shr", middle, sixteen))))
    return high, at.binary("mul", x, at.u32(multiplier))


# Significant bits of each float type: a draw keeps that many bits, so it is exact and below 1.
_MANTISSA_BITS = {16: 11, 32: 24, 64: 53}


def _convert(at: _Emitter, words: list, t: T.DataType):
    """Uniform bits as a value of `t`: floats in [0, 1) on a grid of 2**-mantissa, integers
    over their whole range."""
    if t.is_float:
        bits = _MANTISSA_BITS[t.bits]
        if t.bits < 64:
            value = at.emit(ir.Cast(at.binary("shr", words[0], at.u32(32 - bits)), t))
        else:  # 27 high bits of one word above 26 of the other
            high = at.emit(ir.Cast(at.binary("shr", words[0], at.u32(5)), t))
            low = at.emit(ir.Cast(at.binary("shr", words[1], at.u32(6)), t))
            value = at.binary("add", at.binary("mul", high, at.const(float(1 << 26), t)), low)
        return at.binary("mul", value, at.const(2.0 ** -bits, t))
    if t.bits < 64:
        return at.emit(ir.Cast(words[0], t)) if t is not T.u32 else words[0]
    low, high = (at.emit(ir.Cast(w, T.u64)) for w in words)
    joined = at.binary("bit_or", low, at.binary("shl", high, at.const(32, T.u64)))
    return joined if t is T.u64 else at.emit(ir.Cast(joined, t))


class _Emitter:
    """Inserts statements into `block` before position `at`, in order."""

    def __init__(self, block: ir.Block, at: int):
        self.block, self.at = block, at

    def emit(self, s: ir.Stmt) -> ir.Stmt:
        s.block = self.block
        self.block.stmts.insert(self.at, s)
        self.at += 1
        return s

    def const(self, value, t: T.DataType) -> ir.Stmt:
        return self.emit(ir.Const(value, t))

    def u32(self, value: int) -> ir.Stmt:
        return self.const(value, T.u32)

    def binary(self, op: str, a: ir.Stmt, b: ir.Stmt) -> ir.Stmt:
        return self.emit(ir.Binary(op, a, b, a.type))

    def xor(self, a: ir.Stmt, b: ir.Stmt) -> ir.Stmt:
        return self.binary("bit_xor", a, b)
