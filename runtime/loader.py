"""`qdc.runtime.load`: run prebuilt kernels without the compiler (API.md §4, Ahead of time).

    mod = load("cache", "heat", arch="cpu")    # a cache folder or a `qdc pack` bundle
    mod.T.from_numpy(t0); mod.step(0.1)        # fields and kernels are attributes

Every record and artifact of the module is verified (format version, sha256) before any
native code is loaded; a failure raises `qdc.CacheError` naming the file. Nothing read
from the cache is executed as Python: records are msgpack data, and the launcher only
turns checked identifiers into its generated binding code.
"""
from __future__ import annotations

import os

from . import context
from .contract.arches import ARCHES
from .contract.artifact import GRAD_SUFFIX
from .adstack import launch_hooks
from .cache import cache_error, module_path, module_problems, open_store, read_entry, read_module
from .contract.errors import QdcError
from .fields import Field
from .launcher import make_launcher, stub_function
from .contract.types import by_name



def load(cache_dir_or_bundle, module: str, arch: str = "cpu") -> "LoadedModule":
    """Load module `module` (its kernel file's stem) built for `arch` by `qdc build`."""
    if not isinstance(cache_dir_or_bundle, (str, os.PathLike)):
        raise TypeError(f"load(): the first argument must be a cache folder or bundle path, "
                        f"got {type(cache_dir_or_bundle).__name__}")
    if not isinstance(module, str):
        raise TypeError(f"load(): module must be a module name string such as 'saxpy', got {type(module).__name__}")
    if not isinstance(arch, str):
        raise TypeError(f"load(): arch must be a string such as 'cpu', got {type(arch).__name__}")
    if arch not in ARCHES:
        raise ValueError(f"load(): unknown arch '{arch}' (choose from {', '.join(ARCHES)})")
    store = open_store(cache_dir_or_bundle)
    record = read_module(store, module, arch)
    where = store.where(module_path(module, arch))
    entries = {}
    for name, key in record["kernels"].items():
        try:
            entries[name] = read_entry(store, key)
        except FileNotFoundError:
            raise cache_error(where, f"kernel '{name}' refers to cache entry {key[:12]}…, which is missing "
                                     f"(evicted by `qdc clean`?): rebuild with `qdc build`") from None
    problems = module_problems(where, record, entries)  # e.g. a record naming the wrong variant's entry
    if problems:
        raise cache_error(*problems[0])
    context.for_arch(arch)
    return LoadedModule(record, entries, store.location)


class LoadedKernel:
    """A prebuilt kernel. The module exposes its `function`, called like the `@qd.kernel` it was
    built from and, like that one, the launch function itself (launcher.py, "Owners"): bound
    to the active runtime, a call goes straight to the native code; after `qd.init` its first
    call loads the kernel on the new runtime."""

    def __init__(self, name: str, entry, fields: list, arch: str, grad: "LoadedKernel | None" = None):
        self.__name__ = name
        self._entry, self._fields, self._arch = entry, fields, arch
        self.function = stub_function(name, [p.name for p in entry.meta.params], self._slow_call)
        self.function.grad = grad.function if grad is not None else self._no_grad

    def _launcher(self):
        """Load the kernel on the active runtime and make `function` its launch function."""
        rt = context.current()
        if rt.arch != self._arch:
            raise QdcError(f"kernel '{self.__name__}' was loaded for arch '{self._arch}' but the active runtime "
                           f"is '{rt.arch}': load the module again for '{rt.arch}'")
        meta = self._entry.meta
        loaded = rt.device.load_kernel(self._entry.artifacts, meta)
        # Built ahead of time: an adstack overflow's remedy is a rebuild, not qd.init options.
        hooks = launch_hooks(meta, prebuilt=True) if meta.adstack.get("stacks") else None
        launch = make_launcher(meta, rt.device, loaded, self._fields, hooks=hooks, function=self.function)
        return launch.__qdc_launcher__

    def _slow_call(self, *args):
        return self._launcher().launch(*args)

    def _no_grad(self, *args, **kwargs):
        raise QdcError(f"kernel '{self.__name__}' has no reverse-mode variant in this build (it is built "
                       f"only for kernels that touch a needs_grad field or ndarray)")

    def __repr__(self):
        return f"<qdc loaded kernel {self.__name__} ({self._arch})>"


class LoadedModule:
    """Fields and kernels of one built module, as attributes."""

    def __init__(self, record: dict, entries: dict, location: str):
        self.__name__ = record["module"]
        self._arch, self._location = record["arch"], location
        self._fields = {name: Field(by_name(dtype), tuple(shape), needs_grad, name)
                        for name, dtype, shape, needs_grad in record["fields"]}
        self._kernels = {}
        for name in sorted(entries, key=lambda n: n.endswith(GRAD_SUFFIX), reverse=True):
            base = name[:-len(GRAD_SUFFIX)] if name.endswith(GRAD_SUFFIX) else name
            grad = self._kernels.get(base + GRAD_SUFFIX) if base == name else None
            self._kernels[name] = LoadedKernel(base, entries[name], self._bind_fields(entries[name]),
                                               self._arch, grad)
        exposed = {**self._fields, **{n: k.function for n, k in self._kernels.items() if not n.endswith(GRAD_SUFFIX)}}
        for name, value in exposed.items():
            if name in self.__dict__ or hasattr(type(self), name):  # would replace the module object's own state
                raise QdcError(f"module '{self.__name__}' ({location}) defines '{name}', which clashes with an "
                               f"attribute of loaded modules; rename that field or kernel and rebuild")
            setattr(self, name, value)
        for k in self._kernels.values():  # dlopen everything now: the first launch pays nothing extra
            k._launcher()

    def _bind_fields(self, entry) -> list:
        """The module's Field objects for the entry's field table, checked against its metadata."""
        out = []
        for fm in entry.meta.fields:
            base = fm.name[:-len(GRAD_SUFFIX)] if fm.is_grad and fm.name.endswith(GRAD_SUFFIX) else fm.name
            f = self._fields.get(base)
            if f is not None and fm.is_grad:
                f = f.grad
            if f is None or f.dtype.name != fm.dtype or tuple(f.shape) != tuple(fm.shape):
                raise cache_error(entry.where, f"kernel '{entry.meta.name}' uses field '{fm.name}' "
                                               f"({fm.dtype}{list(fm.shape)}), which module '{self.__name__}' "
                                               f"does not declare that way: rebuild the module")
            out.append(f)
        return out

    def adstack_heap_bytes(self) -> int:
        """Bytes held by the runtime's adstack heap (API.md §3), as `qd.adstack_heap_bytes()`."""
        from .adstack import adstack_heap_bytes
        return adstack_heap_bytes()

    def __repr__(self):
        kernels = sorted(n for n in self._kernels if not n.endswith(GRAD_SUFFIX))
        return (f"<qdc module {self.__name__} ({self._arch}) from {self._location}: "
                f"kernels {', '.join(kernels)}; fields {', '.join(sorted(self._fields))}>")
