"""Binding arguments into the launch context and launching: the per-call hot path.

For each compiled kernel, `make_launcher` generates a small Python function whose signature
is the kernel's (so a missing argument is reported by Python itself, naming the kernel and
the parameter) and whose body writes the arguments straight into the ctx buffer (the word
layout of runtime/artifact.py) and makes one foreign call. For
`k(a: ndarray(f32, 1), s: f32, n: i32)` the generated source is:

    def k(a, s, n, *_q_extra):
        if _q_stale or _q_extra:
            return _q_slow(a, s, n, *_q_extra)
        if a is not _q_arr0 or _q_numpy0 and _q_len(a) != _q_len0:
            _q_bind0(a)
        try:
            _q_pack1(_q_mem, 16, s, n)
        except _q_scalar_errors:
            _q_bad_scalars(1, (s, n,))
        _q_call(_q_arg)

Why it is fast:
- Scalars: each run of consecutive scalar slots is one `struct.pack_into` (which also does
  the type checking: a float for an i32 or a str for an f32 raises, and only then
  `_q_bad_scalars` works out which parameter to name).
- Ndarrays: full validation (type, dtype, ndim, C-contiguity, gradient buffer) and the data
  pointer (`a.ctypes.data` costs a microsecond) happen in `_q_bind<i>` only when the argument
  is not the same object as last time. The launcher keeps a reference to the last array
  passed for each parameter: that keeps its memory alive and makes numpy refuse to `resize`
  it, so its data pointer cannot change. A qd.ndarray's shape is fixed too. What a numpy
  array can still do is change shape in place (`a.shape = ...`, same size): for ndim 1 and
  2, `len(a)` detects every such change that keeps ndim (the first dimension and the size
  fix the second) at a third of the cost of comparing `a.shape`, which higher ranks do.
  Not re-checked, because each would cost as much as a scalar argument and none can make
  the kernel touch memory outside the array: an in-place change of ndim that keeps the
  first dimension (`a.shape = (16, 1)` on an array of shape (16,) passed before), an
  in-place `a.dtype = ...` to a type of the same item size, `a.strides = ...` (deprecated).
- The native call is `_q_call(_q_arg)` as the device hands it out (`Device.launch_call`):
  on the CPU the ctypes function itself applied to a `byref` of the ctx buffer.
- Runtime changes (`qd.init`) do not cost a check per launch beyond one global: the
  runtime flips `_q_stale` in every live launcher (`context.on_reset`) and the slow path
  rebinds (or, for a kernel object, recompiles) and relaunches.

`launch.__qdc_launcher__.owner_call(fallback)` is the same launcher taking an owner (the
kernel object) as first parameter, to be installed as the owner's class `__call__` (CPython
then calls it directly, without a frame of the owner's own); once stale it returns
`fallback(owner, *args)` instead of rebinding, so the owner can recompile.

Hooks. `make_launcher(..., hooks=LaunchHooks(prepare=..., finish=...))` adds, around the
native call, `prepare(ctx)` right before it and `finish()` right after it:
- `prepare(ctx)` gets a `LaunchContext`: `meta`, `device`, `fields`, `args` (this launch's
  arguments in parameter order, as passed) and `words` (a writable `np.uint64` view of the
  ctx buffer, every argument already bound). It may read live data (scalars, ndarray shapes
  and elements, fields) and write words of its own (e.g. an adstack heap pointer); it must
  not replace argument words. The same context object is reused by every launch.
- `finish()` runs after the native call returns; it may raise (e.g. AdStackOverflowError),
  which propagates to the caller. On the CPU the work is complete when it runs.
Either may be None. A kernel without hooks gets generated code without any trace of them.

Only identifiers that pass `str.isidentifier` and integers reach the generated source, so
metadata from a cache can never inject code.

Threads: a launcher has one ctx buffer, so one kernel must not be launched from two Python
threads at once (launches of different kernels may interleave freely).
"""
from __future__ import annotations

import ctypes
import keyword
import struct

import numpy as np

from . import context
from .artifact import KernelMeta
from .fields import Field, Ndarray
from .types import by_name

_PACK_CODE = {"i8": "b", "i16": "h", "i32": "i", "i64": "q", "u8": "B", "u16": "H", "u32": "I",
              "u64": "Q", "f16": "e", "f32": "f", "f64": "d", "u1": "?"}
_SCALAR_ERRORS = (struct.error, TypeError, ValueError, OverflowError)
_RESERVED = "_q_"
_UNBOUND = object()  # the cached array of a parameter before its first launch: matches nothing


class LaunchHooks:
    """Optional callbacks around the native call; see the module docstring for the contract."""
    __slots__ = ("prepare", "finish")

    def __init__(self, prepare=None, finish=None):
        self.prepare, self.finish = prepare, finish


class LaunchContext:
    """What `prepare(ctx)` sees: the kernel's metadata, device, fields, this launch's args and
    the ctx words (np.uint64, writable)."""
    __slots__ = ("meta", "device", "fields", "words", "args")

    def __init__(self, meta, device, fields, words):
        self.meta, self.device, self.fields, self.words = meta, device, fields, words
        self.args = ()


def _where(meta: KernelMeta, index: int) -> str:
    return f"kernel '{meta.name}', argument '{meta.params[index].name}'"


def explain_scalar(meta: KernelMeta, index: int, value):
    """Raise the TypeError/ValueError for scalar argument `index`, or return if it is fine."""
    p = meta.params[index]
    if p.dtype == "u1":
        if not isinstance(value, (bool, int, np.bool_, np.integer)) or value not in (0, 1):
            raise TypeError(f"{_where(meta, index)}: expected a u1 (bool) scalar, got "
                            f"{type(value).__name__} {value!r}"[:300])
        return
    try:
        struct.pack("=" + _PACK_CODE[p.dtype], value)
    except OverflowError:
        raise ValueError(f"{_where(meta, index)}: {value!r} is out of range for {p.dtype}"[:300]) from None
    except (struct.error, TypeError, ValueError):
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            raise ValueError(f"{_where(meta, index)}: {value!r} is out of range for {p.dtype}"[:300]) from None
        kind = "an integer" if p.dtype[0] in "iu" else "a number"
        raise TypeError(f"{_where(meta, index)}: expected a {p.dtype} scalar ({kind}), got "
                        f"{type(value).__name__} {value!r}"[:300]) from None


def check_ndarray(meta: KernelMeta, index: int, value) -> None:
    """Raise the TypeError/ValueError that rejects `value` for ndarray parameter `index`."""
    p = meta.params[index]
    where = _where(meta, index)
    want = f"an ndarray of {p.dtype} with ndim={p.ndim}"
    if isinstance(value, np.ndarray):
        if value.dtype != by_name(p.dtype).np_dtype:
            raise TypeError(f"{where}: expected {want}, got a numpy array of dtype {value.dtype}")
        if value.ndim != p.ndim:
            raise ValueError(f"{where}: expected {want}, got a numpy array with ndim={value.ndim}")
        if not value.flags.c_contiguous:
            raise ValueError(f"{where}: the numpy array is not C-contiguous; pass np.ascontiguousarray(...)")
        if meta.is_grad and p.needs_grad:
            raise TypeError(f"{where}: the gradient kernel needs a qd.ndarray(..., needs_grad=True), "
                            f"not a numpy array (it has nowhere to put the gradient)")
        return
    if isinstance(value, Ndarray):
        if value.dtype.name != p.dtype:
            raise TypeError(f"{where}: expected {want}, got a qd.ndarray of {value.dtype}")
        if value.ndim != p.ndim:
            raise ValueError(f"{where}: expected {want}, got a qd.ndarray with ndim={value.ndim}")
        if meta.is_grad and p.needs_grad and value.grad is None:
            raise ValueError(f"{where}: the gradient kernel needs a qd.ndarray created with needs_grad=True")
        return
    if isinstance(value, Field):
        raise TypeError(f"{where}: expected {want}, got {value._what()}; fields are global: "
                        f"use them in the kernel directly instead of passing them")
    raise TypeError(f"{where}: expected {want} (a numpy array or qd.ndarray), got {type(value).__name__}")


class _Launcher:
    """The state behind one generated launch function: ctx buffer, caches, runtime binding."""

    def __init__(self, meta: KernelMeta, device, loaded, fields: list, hooks):
        self.meta, self.device, self.fields = meta, device, fields
        self.buf = (ctypes.c_uint64 * max(meta.ctx_words, 1))()
        self.words = np.frombuffer(self.buf, np.uint64)
        self.temps = np.zeros(max(meta.num_temps, 1), np.uint64)
        call, arg = device.launch_call(loaded, self.buf)
        # pack_into a memoryview: with the ctypes array itself as target, getting its buffer
        # costs more than the packing.
        self.g = {"_q_stale": True, "_q_mem": memoryview(self.buf).cast("B"), "_q_call": call, "_q_arg": arg,
                  "_q_scalar_errors": _SCALAR_ERRORS, "_q_bad_scalars": self.bad_scalars,
                  "_q_len": len, "_q_bool": bool,  # builtins by names no parameter can shadow
                  "_q_slow": self.slow, "_q_slow_owner": self.slow_owner}
        self.function = self.fallback = self.owner_function = None
        if hooks is not None:
            self.g["_q_prepare"], self.g["_q_finish"] = hooks.prepare, hooks.finish
            self.g["_q_lctx"] = LaunchContext(meta, device, fields, self.words)

    # ---- slow paths -----------------------------------------------------------------------

    def bind_runtime(self) -> None:
        """Point the ctx at the current runtime's field memory, temporaries and thread count."""
        m, w = self.meta, self.words
        for i, f in enumerate(self.fields):
            w[m.field_slot0 + i] = f.allocation().ptr
        w[m.temps_slot] = self.temps.ctypes.data
        w[m.threads_slot] = getattr(context.current().device, "num_threads", 1)
        for i, p in enumerate(m.params):
            if p.kind == "ndarray":
                self.g[f"_q_arr{i}"] = _UNBOUND
        self.g["_q_stale"] = False

    def invalidate(self) -> None:
        """Called by `context.reset`: the next launch takes the slow path."""
        self.g["_q_stale"] = True
        for i, p in enumerate(self.meta.params):
            if p.kind == "ndarray":
                self.g[f"_q_arr{i}"] = _UNBOUND  # also drops the reference to the caller's array

    def too_many(self, args):
        names = ", ".join(p.name for p in self.meta.params)
        n = len(self.meta.params)
        raise TypeError(f"kernel '{self.meta.name}' takes {n} argument{'s' * (n != 1)} ({names}) "
                        f"but {len(args)} were given")

    def slow(self, *args):
        if len(args) > len(self.meta.params):
            self.too_many(args)
        self.bind_runtime()
        return self.function(*args)

    def slow_owner(self, owner, *args):
        if len(args) > len(self.meta.params):
            self.too_many(args)
        return self.fallback(owner, *args)

    def bad_scalars(self, first: int, values: tuple):
        for i, v in enumerate(values):
            explain_scalar(self.meta, first + i, v)
        raise AssertionError("a scalar was rejected but none of them is invalid")  # unreachable

    def binder(self, index: int):
        """`bind(a)` for ndarray parameter `index`: validate, write pointer/shape/grad words, cache."""
        meta, g, w = self.meta, self.g, self.words
        p = meta.params[index]
        s = p.slot

        def bind(a):
            check_ndarray(meta, index, a)
            if isinstance(a, np.ndarray):
                ptr, grad = a.ctypes.data, 0
            else:
                ptr = a.allocation().ptr
                grad = a.grad.allocation().ptr if a.grad is not None else 0
            w[s] = ptr
            w[s + 1:s + 1 + p.ndim] = a.shape
            if p.needs_grad:
                w[s + 1 + p.ndim] = grad
            g[f"_q_arr{index}"], g[f"_q_shape{index}"] = a, a.shape
            g[f"_q_len{index}"] = a.shape[0] if a.shape else None
            g[f"_q_numpy{index}"] = isinstance(a, np.ndarray)
        return bind

    def bool_converter(self, index: int):
        def as_bool(v):
            explain_scalar(self.meta, index, v)
            return bool(v)
        return as_bool

    # ---- code generation --------------------------------------------------------------------

    def source(self, owner_param: bool) -> str:
        meta, g = self.meta, self.g
        names = [p.name for p in meta.params]
        head = ["_q_owner"] if owner_param else []
        body = ["    if _q_stale or _q_extra:",
                f"        return {'_q_slow_owner' if owner_param else '_q_slow'}"
                f"({', '.join(head + names + ['*_q_extra'])})"]
        for i, p in enumerate(meta.params):
            if p.kind == "ndarray":
                g[f"_q_arr{i}"] = _UNBOUND
                g[f"_q_bind{i}"] = self.binder(i)
                probe = f"_q_len({p.name}) != _q_len{i}" if p.ndim in (1, 2) else f"{p.name}.shape != _q_shape{i}"
                probe = f"_q_numpy{i} and {probe}"
                body += [f"    if {p.name} is not _q_arr{i} or {probe}:",
                         f"        _q_bind{i}({p.name})"]
            elif p.dtype == "u1":
                g[f"_q_as_bool{i}"] = self.bool_converter(i)
                body += [f"    if {p.name}.__class__ is not _q_bool:",
                         f"        {p.name} = _q_as_bool{i}({p.name})"]
        for first, run in self.scalar_runs():
            fmt = "=" + "".join(_PACK_CODE[p.dtype] + "x" * (8 - by_name(p.dtype).nbytes) for p in run)
            g[f"_q_pack{first}"] = struct.Struct(fmt).pack_into
            values = ", ".join(p.name for p in run)
            body += ["    try:", f"        _q_pack{first}(_q_mem, {8 * run[0].slot}, {values})",
                     "    except _q_scalar_errors:", f"        _q_bad_scalars({first}, ({values},))"]
        if "_q_lctx" in g:
            if g["_q_prepare"] is not None:
                body += [f"    _q_lctx.args = ({''.join(n + ', ' for n in names)})", "    _q_prepare(_q_lctx)"]
            body.append("    _q_call(_q_arg)")
            if g["_q_finish"] is not None:
                body.append("    _q_finish()")
        else:
            body.append("    _q_call(_q_arg)")
        return f"def {meta.name}({', '.join(head + names + ['*_q_extra'])}):\n" + "\n".join(body) + "\n"

    def scalar_runs(self):
        """(index of first param, [params]) for each run of scalar params in consecutive slots."""
        runs = []
        for i, p in enumerate(self.meta.params):
            if p.kind != "scalar":
                continue
            if runs and runs[-1][1][-1].slot + 1 == p.slot:
                runs[-1][1].append(p)
            else:
                runs.append((i, [p]))
        return runs

    def build(self, owner_param: bool):
        src = self.source(owner_param)
        code = compile(src, f"<qdc launcher {self.meta.name}>", "exec")
        namespace = {}
        exec(code, self.g, namespace)  # noqa: S102 (only checked identifiers reach the source)
        fn = namespace[self.meta.name]
        fn.__qdc_source__ = src
        fn.__qdc_launcher__ = self
        return fn

    def owner_call(self, fallback):
        """This launcher as `launch(owner, *args)`, for an owner's class `__call__` (see above)."""
        if self.owner_function is None or self.fallback is not fallback:
            self.fallback = fallback
            self.owner_function = self.build(owner_param=True)
        return self.owner_function


def _check_names(meta: KernelMeta) -> None:
    for name in [meta.name] + [p.name for p in meta.params]:
        if not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"invalid identifier {name!r} in kernel metadata")
    for p in meta.params:
        if p.name.startswith(_RESERVED):
            raise ValueError(f"kernel '{meta.name}': parameter names starting with '{_RESERVED}' "
                             f"are reserved for qdc (rename '{p.name}')")


def make_launcher(meta: KernelMeta, device, loaded, fields: list, hooks: LaunchHooks | None = None):
    """Return `launch(*args)` for `meta`; `fields` are the Field objects of meta.fields, in order."""
    _check_names(meta)
    if hooks is None and meta.adstack.get("stacks"):  # the heap sizing and overflow check
        from .adstack import launch_hooks
        hooks = launch_hooks(meta)
    if hooks is not None and hooks.prepare is None and hooks.finish is None:
        hooks = None
    state = _Launcher(meta, device, loaded, fields, hooks)
    state.function = state.build(owner_param=False)
    state.bind_runtime()
    context.on_reset(state)
    return state.function
