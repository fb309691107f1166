"""`qdc.runtime.load`: run prebuilt kernels without the compiler (docs/api.md, Running kernels).

    mod = load("cache", "heat", arch="cpu")    # a cache folder or a `qdc pack` bundle
    mod.T.from_numpy(t0); mod.step(0.1)        # fields and kernels are attributes

Every record and artifact of the module is verified (format version, sha256, and with trusted
keys the signatures of the module record and of every entry: runtime/signing.py) before any
native code is loaded; a failure raises `qdc.CacheError` naming the file and why. Nothing read
from the cache is executed as Python: records are msgpack data, and the launcher only
turns checked identifiers into its generated binding code.
"""
from __future__ import annotations

import os

from . import context, forward_mode, signing
from .contract.arches import ARCHES
from .contract.artifact_schema import VARIANT_SUFFIXES, secondary_field, split_variant
from .adstack import launch_hooks
from .bundle import open_store
from .cache import cache_error, module_path, read_entry, read_module
from .module_check import module_problems
from .contract.errors import QdcError
from .devices.cpu.device import LibraryLoadError, host_libraries
from .fields import ElementType, Field, StructField
from .kernel_function import KernelFunction
from .launcher import make_launcher
from .member_arguments import member_launcher
from .remote import is_remote, read_through
from .contract.types import by_name



def load(cache_dir_or_bundle, module: str, arch: str = "cpu", local_cache=None, trusted_keys=None,
         revoked_keys=None) -> "LoadedModule":
    """Load module `module` (its kernel file's stem) built for `arch` by `qdc build`. A remote
    store's URL (s3://, gs://, az://, http(s)://, file://; runtime/remote.py) is read through
    `local_cache` (default: one folder per remote under the user cache folder): the module is
    fetched and verified there once, and loads offline afterwards. `trusted_keys` (else
    $QDC_TRUSTED_KEYS): public key files written by `qdc keygen`, or their text; with keys, the
    module record and every entry must be signed by one of them that `revoked_keys` (else
    $QDC_REVOKED_KEYS) does not revoke, or loading raises `qdc.CacheError` before any native code
    is loaded."""
    if not isinstance(cache_dir_or_bundle, (str, os.PathLike)):
        raise TypeError(f"load(): the first argument must be a cache folder, bundle path or remote URL, "
                        f"got {type(cache_dir_or_bundle).__name__}")
    if not isinstance(module, str):
        raise TypeError(f"load(): module must be a module name string such as 'saxpy', got {type(module).__name__}")
    if not isinstance(arch, str):
        raise TypeError(f"load(): arch must be a string such as 'cpu', got {type(arch).__name__}")
    if arch not in ARCHES:
        raise ValueError(f"load(): unknown arch '{arch}' (choose from {', '.join(ARCHES)})")
    trust = signing.trust_from(trusted_keys, revoked_keys)
    if is_remote(cache_dir_or_bundle):
        cache_dir_or_bundle = read_through(cache_dir_or_bundle, module, arch, local_cache, trust)
    store = open_store(cache_dir_or_bundle)
    record = read_module(store, module, arch, trust)
    attested = trust.attested(record) if trust is not None else {}  # entry digests a trusted key vouches for
    where = store.where(module_path(module, arch))
    entries, missing = {}, []
    for name, key in record["kernels"].items():
        try:
            entries[name] = read_entry(store, key, trust, attested.get(key))
        except FileNotFoundError:
            missing.append(name)
    if missing:
        raise cache_error(where, f"the module is incomplete: the cache entries of kernel(s) {', '.join(missing)} "
                                 f"are missing (a shard of the build not merged, or evicted by `qdc clean`?): "
                                 f"merge the shards' caches with `qdc merge` or rebuild with `qdc build`")
    problems = module_problems(where, record, entries)  # e.g. a record naming the wrong variant's entry
    if problems:
        raise cache_error(*problems[0])
    skipped = record.get("skipped", {})  # `qdc build --arch all`: variant name -> why the arch cannot express it
    if not (isinstance(skipped, dict) and all(isinstance(r, str) and isinstance(n, str) and n not in entries
                                              and split_variant(n)[0].isidentifier() for n, r in skipped.items())):
        raise cache_error(where, "malformed metadata: skipped")
    if arch == "cpu":  # code built for other CPU platforms only (cpu_targets) is refused here, not at a launch
        for name, entry in entries.items():
            host_libraries(entry.meta.cpu_libraries, name)
    context.for_arch(arch)
    return LoadedModule(record, entries, store.location)


def launch_path(module: "LoadedModule", kernel: str):
    """How launches of `kernel` (a variant's name: `k`, `k.grad`) of a loaded module go on the
    active runtime, and why: a runtime/launch_path.py LaunchPath (`qdc inspect` shows it)."""
    if kernel not in module._kernels:
        raise QdcError(f"module '{module.__name__}' has no kernel '{kernel}'")
    return module._kernels[kernel]._current().path


class LoadedKernel(KernelFunction):
    """A prebuilt kernel. The module exposes its `function` (kernel_function.py), called like
    the `@qd.kernel` it was built from and, like that one, the launch function itself: bound
    to the active runtime, a call goes straight to the native code; after `qd.init` its first
    call loads the kernel on the new runtime. Inside a `FwdMode` (runtime/forward_mode.py) a
    call runs the forward_ad variant, when the build has one (`function.forward_ad`)."""

    def __init__(self, name: str, entry, fields: list, arch: str, grad: "LoadedKernel | None" = None,
                 forward_ad: "LoadedKernel | None" = None, skipped: dict | None = None):
        self.__name__ = name
        self._entry, self._fields, self._arch = entry, fields, arch
        self._skipped = skipped or {}  # variant -> why `qdc build --arch all` skipped it
        # a kernel that reads members off its arguments (dataclass parameters) takes those arguments
        self._members = bool(entry.meta.members)
        super().__init__(name, entry.meta.signature if self._members else [a.name for a in entry.meta.arguments],
                         {"grad": grad.function if grad is not None else self._no_grad,
                          "forward_ad": forward_ad.function if forward_ad is not None else self._no_forward_ad})
        self._forward_ad = forward_ad
        self._state = None  # (runtime generation, launcher state) of the last load

    def _launcher(self):
        """Load the kernel on the active runtime and make `function` its launch function."""
        rt = context.current()
        if rt.arch != self._arch:
            raise QdcError(f"kernel '{self.__name__}' was loaded for arch '{self._arch}' but the active runtime "
                           f"is '{rt.arch}': load the module again for '{rt.arch}'")
        meta = self._entry.meta
        try:
            loaded = rt.device.load_kernel(self._entry.artifacts, meta)
        except LibraryLoadError as e:  # it names no file: the library is loaded from a private copy
            raise LibraryLoadError(f"{self._library_where()}: {e}") from None
        # Built ahead of time: an adstack overflow's remedy is a rebuild, not qd.init options.
        hooks = launch_hooks(meta, prebuilt=True) if meta.adstack.get("stacks") else None
        if self._members:  # the launch reads the members first: it goes through member_launcher
            launch = make_launcher(meta, rt.device, loaded, self._fields, hooks=hooks)
            state = _MemberState(member_launcher(meta, launch, meta.signature))  # its fast code
        else:
            launch = make_launcher(meta, rt.device, loaded, self._fields, hooks=hooks, function=self.function)
            state = launch.__qdc_launcher__
            self.launch_directly(state.fast_code)
        self._state = (rt.generation, state)
        return state

    def _library_where(self) -> str:
        """The cache file of the kernel's native library (its entry folder if it has several)."""
        files = {self._entry.artifact_where[r["artifact"]] for r in self._entry.meta.cpu_libraries}
        return files.pop() if len(files) == 1 else self._entry.where

    def _current(self):
        """The launcher state on the active runtime (loaded now if the runtime changed)."""
        state = self._state
        if state is None or state[0] != context.current().generation:
            return self._launcher()
        return state[1]

    def _slow_call(self, *args):
        if forward_mode.active is not None and self._forward_ad is not None:  # a Jacobian-vector product
            fwd = self._forward_ad
            args, _ = forward_mode.dual_arguments(fwd._entry.meta, args, None)
            return fwd._current().launch(*args)
        state = self._current()
        if state.fast_code is not None:
            self.launch_directly(state.fast_code)  # back from a FwdMode or Tape, or loaded on a new runtime
        return state.launch(*args)

    def _no_forward_ad(self, *args, **kwargs):
        if "forward_ad" in self._skipped:
            raise QdcError(skipped_message(f"{self.__name__}.forward_ad", self._arch, self._skipped["forward_ad"]))
        raise QdcError(f"kernel '{self.__name__}' has no forward-mode variant in this build (it is built only for "
                       f"kernels that touch a needs_dual field)")

    def _no_grad(self, *args, **kwargs):
        if "grad" in self._skipped:
            raise QdcError(skipped_message(f"{self.__name__}.grad", self._arch, self._skipped["grad"]))
        raise QdcError(f"kernel '{self.__name__}' has no reverse-mode variant in this build (it is built "
                       f"only for kernels that touch a needs_grad field or ndarray)")

    def __repr__(self):
        return f"<qdc loaded kernel {self.__name__} ({self._arch})>"


class _MemberState:
    """The launcher state of a kernel reading members (runtime/member_arguments.py): its calls
    go through the stub, which launches through the member reads."""
    __slots__ = ("launch",)
    fast_code = None

    def __init__(self, launch):
        self.launch = launch


class SkippedKernel:
    """A kernel that `qdc build --arch all` skipped for this arch because the target cannot
    express it (f64 on Metal, say): calling it, its `grad` or its `forward_ad` says so and why."""

    def __init__(self, name: str, arch: str, reason: str):
        self.__name__ = name
        self.message = skipped_message(name, arch, reason)

    def __call__(self, *args, **kwargs):
        raise QdcError(self.message)

    @property
    def grad(self):
        return self

    @property
    def forward_ad(self):
        return self

    def __repr__(self):
        return f"<qdc kernel {self.__name__}, not built for this arch>"


def skipped_message(name: str, arch: str, reason: str) -> str:
    return (f"kernel '{name}' was not built for arch '{arch}': `qdc build --arch all` skipped it because the "
            f"target cannot express it: {reason}")


def _module_field(record: list, element_shape: list) -> Field:
    """The Field of a module record's [name, dtype, storage shape, needs_grad(, needs_dual)]; a
    field of vectors/matrices (`element_shape`) has the element's axes last in the storage shape."""
    name, dtype, storage = record[0], by_name(record[1]), record[2]
    shape = tuple(storage[:len(storage) - len(element_shape)])
    element = ElementType(dtype, tuple(element_shape)) if element_shape else dtype
    return Field(element, shape, record[3], name, needs_dual=record[4:5] == [True])


def _module_struct(name: str, layout: dict, fields: dict) -> StructField:
    """The struct field over a module's member fields (record: member -> field name or nested record)."""
    members = {m: _module_struct(f"{name}__{m}", v, fields) if isinstance(v, dict) else fields[v]
               for m, v in layout.items()}
    return StructField.of_members(name, members)


class LoadedModule:
    """Fields and kernels of one built module, as attributes."""

    def __init__(self, record: dict, entries: dict, location: str):
        self.__name__ = record["module"]
        self._arch, self._location = record["arch"], location
        # [name, dtype, shape, needs_grad(, needs_dual)]
        element_shapes = record.get("element_shapes", {})
        self._fields = {f[0]: _module_field(f, element_shapes.get(f[0], [])) for f in record["fields"]}
        self._kernels = {}
        skipped = record.get("skipped", {})
        for name in sorted(entries, key=_is_primary):  # the variants first: each kernel takes its own
            base, variant = split_variant(name)
            variants = {v: self._kernels.get(base + suffix) for v, suffix in VARIANT_SUFFIXES.items()} \
                if variant == "forward" else {}
            reasons = {v: skipped[base + suffix] for v, suffix in VARIANT_SUFFIXES.items() if base + suffix in skipped}
            self._kernels[name] = LoadedKernel(base, entries[name], self._bind_fields(entries[name]),
                                               self._arch, variants.get("grad"), variants.get("forward_ad"), reasons)
        structs = {n: _module_struct(n, layout, self._fields) for n, layout in record.get("struct_fields", {}).items()}
        exposed = {**self._fields, **structs, **{n: k.function for n, k in self._kernels.items() if _is_primary(n)},
                   **{n: SkippedKernel(f"{self.__name__}.{n}", self._arch, r) for n, r in skipped.items()
                      if _is_primary(n)}}
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
            base, secondary = secondary_field(fm.name) if fm.is_grad else (fm.name, None)
            f = self._fields.get(base)
            if f is not None and fm.is_grad:
                f = getattr(f, secondary or "grad")
            if f is None or f.dtype.name != fm.dtype or tuple(f.storage_shape) != tuple(fm.shape):
                raise cache_error(entry.where, f"kernel '{entry.meta.name}' uses field '{fm.name}' "
                                               f"({fm.dtype}{list(fm.shape)}), which module '{self.__name__}' "
                                               f"does not declare that way: rebuild the module")
            out.append(f)
        return out

    def adstack_heap_bytes(self) -> int:
        """Bytes held by the runtime's adstack heap (docs/api.md, Autodiff), as `qd.adstack_heap_bytes()`."""
        from .adstack import adstack_heap_bytes
        return adstack_heap_bytes()

    def __repr__(self):
        kernels = sorted(n for n in self._kernels if _is_primary(n))
        return (f"<qdc module {self.__name__} ({self._arch}) from {self._location}: "
                f"kernels {', '.join(kernels)}; fields {', '.join(sorted(self._fields))}>")


def _is_primary(name: str) -> bool:
    """A module record's kernel name that is a kernel itself, not one of its variants."""
    return split_variant(name)[1] == "forward"
