"""Binding arguments into the launch context and launching: the per-call hot path.

For each compiled kernel we generate a small Python function whose signature is the kernel's
(so a missing argument is reported by Python itself with the kernel's and parameter's names)
and whose body writes each argument straight into a ctypes structure laid out as the ctx
words. Only identifiers that pass `str.isidentifier` and positional slot numbers reach the
generated source, so metadata from a cache can never inject code.
"""
from __future__ import annotations

import ctypes
import keyword

import numpy as np

from . import context
from .artifact import KernelMeta
from .fields import Ndarray
from .types import by_name

_CTYPE = {
    "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32, "i64": ctypes.c_int64,
    "u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32, "u64": ctypes.c_uint64,
    "f32": ctypes.c_float, "f64": ctypes.c_double, "u1": ctypes.c_bool, "f16": ctypes.c_uint16,
}


def _ctx_struct(meta: KernelMeta):
    """A ctypes Structure with one 8-byte slot per ctx word; scalar slots typed by their param."""
    fields = []
    typed = {p.slot: _CTYPE[p.dtype] for p in meta.params if p.kind == "scalar"}
    for w in range(meta.ctx_words):
        ct = typed.get(w, ctypes.c_uint64)
        fields.append((f"s{w}", ct))
        pad = 8 - ctypes.sizeof(ct)
        if pad:
            fields.append((f"_pad{w}", ctypes.c_uint8 * pad))
    return type("Ctx", (ctypes.Structure,), {"_fields_": fields})


class ArgumentBinder:
    """Explains a rejected argument: TypeError/ValueError naming the kernel and parameter."""

    def __init__(self, meta: KernelMeta):
        self.meta = meta

    def bad(self, index: int, value):
        p = self.meta.params[index]
        where = f"kernel '{self.meta.name}', argument '{p.name}'"
        if p.kind == "scalar":
            raise TypeError(f"{where}: expected a {p.dtype} scalar, got {type(value).__name__} {value!r}"[:300])
        want = f"an ndarray of {p.dtype} with ndim={p.ndim}"
        if isinstance(value, np.ndarray):
            if value.dtype != by_name(p.dtype).np_dtype:
                raise TypeError(f"{where}: expected {want}, got dtype {value.dtype}")
            if value.ndim != p.ndim:
                raise ValueError(f"{where}: expected {want}, got ndim={value.ndim}")
            if not value.flags.c_contiguous:
                raise ValueError(f"{where}: the array is not C-contiguous; pass np.ascontiguousarray(...)")
        if isinstance(value, Ndarray):
            if value.dtype.name != p.dtype:
                raise TypeError(f"{where}: expected {want}, got qd.ndarray of {value.dtype}")
            if value.ndim != p.ndim:
                raise ValueError(f"{where}: expected {want}, got ndim={value.ndim}")
            if self.meta.is_grad and p.needs_grad and value.grad is None:
                raise ValueError(f"{where}: the gradient kernel needs a qd.ndarray created with needs_grad=True")
        if self.meta.is_grad and p.needs_grad and isinstance(value, np.ndarray):
            raise TypeError(f"{where}: the gradient kernel needs a qd.ndarray(..., needs_grad=True), "
                            f"not a numpy array (it has nowhere to put the gradient)")
        raise TypeError(f"{where}: expected {want}, got {type(value).__name__}")


def make_launcher(meta: KernelMeta, device, loaded, fields: list):
    """Return `launch(*args)` for `meta`; `fields` are the Field objects of meta.fields, in order."""
    for name in [meta.name] + [p.name for p in meta.params]:
        if not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"invalid identifier {name!r} in kernel metadata")
    ctx = _ctx_struct(meta)()
    temps = np.zeros(max(meta.num_temps, 1), np.uint64)
    binder = ArgumentBinder(meta)
    g = {"_ctx": ctx, "_fn": device.launch, "_loaded": loaded, "_addr": ctypes.addressof(ctx),
         "_ctxmod": context, "_np_ndarray": np.ndarray, "_Ndarray": Ndarray, "_bad": binder.bad,
         "_state": [0], "_fields": fields, "_temps": temps, "_f16": np.float16}

    def bind_globals():
        for i, f in enumerate(fields):
            setattr(ctx, f"s{meta.field_slot0 + i}", f.allocation().ptr)
        ctx_set(meta.temps_slot, temps.ctypes.data)
        ctx_set(meta.threads_slot, getattr(context.current().device, "num_threads", 1))
        g["_state"][0] = context.current().generation

    def ctx_set(slot, value):
        setattr(ctx, f"s{slot}", value)

    g["_bind_globals"] = bind_globals
    lines = [f"def {meta.name}({', '.join(p.name for p in meta.params)}):",
             "    c = _ctx"]
    for i, p in enumerate(meta.params):
        s = p.slot
        if p.kind == "scalar":
            value = f"_f16({p.name}).view('u2').item()" if p.dtype == "f16" else p.name
            lines += ["    try:", f"        c.s{s} = {value}",
                      f"    except (TypeError, ValueError, OverflowError):", f"        _bad({i}, {p.name})"]
            continue
        g[f"_dt{i}"] = by_name(p.dtype).np_dtype
        shape_writes = [f"        c.s{s + 1 + d} = a.shape[{d}]" for d in range(p.ndim)]
        grad_slot = s + 1 + p.ndim
        lines += [f"    a = {p.name}",
                  "    if a.__class__ is _np_ndarray:",
                  f"        if a.dtype != _dt{i} or a.ndim != {p.ndim} or not a.flags.c_contiguous:",
                  f"            _bad({i}, a)"]
        if meta.is_grad and p.needs_grad:
            lines.append(f"        _bad({i}, a)")
        lines += ["        c.s%d = a.ctypes.data" % s] + shape_writes
        if p.needs_grad:
            lines.append(f"        c.s{grad_slot} = 0")
        lines += ["    elif isinstance(a, _Ndarray):",
                  f"        if a.dtype.np_dtype != _dt{i} or len(a.shape) != {p.ndim}:",
                  f"            _bad({i}, a)",
                  f"        c.s{s} = a.allocation().ptr"] + shape_writes
        if p.needs_grad:
            lines += ["        if a.grad is not None:",
                      f"            c.s{grad_slot} = a.grad.allocation().ptr",
                      "        else:"]
            lines += [f"            _bad({i}, a)"] if meta.is_grad else [f"            c.s{grad_slot} = 0"]
        lines += ["    else:", f"        _bad({i}, a)"]
    lines += ["    if _ctxmod._current.generation != _state[0]:", "        _bind_globals()",
              "    _fn(_loaded, _addr)"]
    src = "\n".join(lines) + "\n"
    exec(compile(src, f"<qdc launcher {meta.name}>", "exec"), g)
    launch = g[meta.name]
    launch.__qdc_source__ = src
    context.current()
    bind_globals()
    return launch
