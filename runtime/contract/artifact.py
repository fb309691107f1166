"""The artifact format (version 4): the one contract between the compiler and the runtime.

A compiled kernel is a `KernelMeta` (msgpack-able dict) plus named binary artifacts. The
launch context ("ctx") is an array of 64-bit words whose layout the metadata describes:

    word  param.slot                 scalar argument (stored in the low bytes by its type); a
                                     vector/matrix argument is one scalar record per element
    word  param.slot                 ndarray data pointer, then one word per dimension (shape),
                                     then the gradient buffer pointer if needs_grad
    word  field_slot0 + i            base pointer of the kernel's i-th field
    word  temps_slot                 device address of the kernel's temporaries: `num_temps`
                                     8-byte words in device memory (values crossing tasks,
                                     each in the low bytes of its word)
    word  threads_slot               CPU only: number of worker threads to use
    word  adstack_slot + 0, 1, 2     only if the kernel has adstacks (adstack["stacks"] non-empty):
                                     heap pointer, per-thread stride in bytes, device address
                                     of the overflow word (in the launch's error slot,
                                     runtime/device.py); then per stack s: its byte offset in
                                     a thread's slice (adstack_slot + 3 + 2s) and capacity (+ 4 + 2s);
    word  adstack_threads_slot       then the number of thread slices the heap holds: a task with
                                     adstacks runs on at most that many threads
    word  debug_slot                 only if the kernel has bounds checks (debug_checks non-empty):
                                     device address of the bounds-check words in the launch's
                                     error slot (runtime/contract/bounds.py)
    word  random_slot + 0, 1         only if the kernel draws random numbers ("random" true): the
                                     seed, then the number of earlier launches of kernels that
                                     draw since qd.init (runtime/random_stream.py); SPIR-V reads
                                     them as four u32 "args" words after the parameters'
    word  print_slot                 only if the kernel has messages (print, assert, debug checks):
                                     the device address of the print buffer
                                     (runtime/contract/print_buffer.py)

Entry points. `entry` runs every task of the kernel in order, in one call (`void
entry(uint64_t *ctx)` on the CPU: the fast path of synchronous devices). Every task also has
an entry of its own, its record's "entry" (on the CPU `void task_entry(uint64_t *ctx)`: the
whole task, its range computed from the ctx and spread over threads as its launch policy
says), which asynchronous devices launch one at a time. A task entry computes its iteration
range itself and never runs outside it, so a launch's grid never decides correctness.
Every artifact defines exactly the entries its record names (a SPIR-V module's one entry
point is its task's entry; the per-kind rules are in runtime/contract/entry_points.py): the
cache checks that on every read, so an artifact swapped between entries, or whose symbols
were renamed, is refused even under a re-signed record. Version 4 entries written while
every SPIR-V entry point was "main" fail that check, asking for a rebuild.

`tasks` has one record per task, in launch order, a dict:
    "name", "kind" ("serial" | "range_for"), "serial" (a range-for run on one thread),
    "source_kind" (the loop it came from),
    "entry"       its entry symbol,
    "iterations"  its trip count, a post-order SizeExpr node list (runtime/contract/sizeexpr.py):
                  [1] for a serial task; for a range-for task an upper bound, exact when its
                  range is bounded by constants, scalar arguments, ndarray shapes and field,
                  ndarray or temporary elements combined with + - * max min; [] when not
                  expressible (the device then dispatches its most). A `temp` leaf reads a
                  kernel temporary that an earlier task of the launch computed: evaluating
                  it waits for those tasks (a ranged read of device memory);
    "launch"      the launch policy, written by the target: {"policy": "cpu_chunks",
                  "parallel_from": N} (CPU: the range is split over worker threads from N
                  iterations; 0 = always one thread; optionally "lanes": W, the task runs W
                  iterations at a time and a thread takes W adstack heap slices, or "scalar":
                  why it runs one at a time) or {"policy": "grid", "block_dim": B}
                  (GPU: blocks of B threads, B from qd.loop_config; 0 = the device's default;
                  SPIR-V: "addressed", the [resource, index] of each array the task reaches by
                  buffer device address instead of a binding, in the order of the "addresses"
                  words; "grid_temp": T, a range task whose module computes its own grid into
                  temporaries T and T + 1, which the device dispatches indirectly:
                  runtime/contract/spirv_args.py);
    "adstacks"    the ids (positions in adstack["stacks"]) of the stacks the task holds,
    "bindings"    (only on targets with descriptor bindings: SPIR-V) [set, binding, resource,
                  index] per buffer the task's entry reads or writes; resource is one of
                  BINDING_RESOURCES, index the field's or ndarray parameter's position.
The device turns a record's policy and evaluated trip count into the thread slices a launch
dispatches (Device.task_slices), which adstack heaps are sized for.

`adstack["stacks"]` has one record per stack (a dict): "task" (index), "dtype", "adjoint"
(entries carry an adjoint slot), "max_size" (the capacity when there is no tree), "name",
"where" (source location), "source" (how it was sized) and "size_expr" (post-order SizeExpr
node list of its capacity; [] = use max_size; never reads a temporary, since it is evaluated
before the launch). How many threads its task runs on comes from the task record. The
runtime evaluates the trees before every launch. `adstack["layout"]`, when present, is the
heap layout the code was generated for (runtime/contract/adstack_layout.py).

`cpu_libraries` (CPU entries; empty in entries written before it existed, which the CPU
device refuses) has one record per native library of the kernel, lowest ISA level first:
{"artifact": kind of the library's artifact, "target": the ISA level or CPU name it was built
for, "machine": architecture family ("x86_64", "aarch64"), "os" ("linux", "macos"; absent in
entries written before `cpu_targets`: Linux), "triple" (LLVM's), "features": the CPU features
its code needs, LLVM names}, and "level" where one library holds the code of several levels
(a portable build): the device passes it to the library's `qdc_set_cpu_level` after loading.
An entry built for several platforms (`cpu_targets`) has one library per platform, each with
its levels. The CPU device loads, of its host platform's, the last one whose features the host has
(runtime/devices/cpu/device.py; compiler/targets/cpu/isa_levels.py says what `cpu_target` builds).
Each library exports `entry` and every task's entry, and no other function but `<entry>_np`,
`<entry>_py` (runtime/devices/cpu/numpy_binding.py) and `qdc_set_cpu_level`.

`returns` (only in kernels that return a value) is {"values": [[dtype, shape], ...], "tuple":
bool, "slots": [...]} (and "structs" where a struct is returned: see struct parameters
below): per returned item its type and element shape ([] a scalar, [n] a
vector, [n, m] a matrix), whether the items form a tuple (else there is exactly one), and
the kernel temporary holding each returned scalar (items in order, each row-major). The
serial top-level task stores them; the launch function reads them back after the launch
(runtime/returns.py). A grad kernel returns nothing.

`debug_checks` (only with `debug=True`) has one record per checked global access, its id
being its position: [kind, name, is_grad, extent, where] with kind "field" (extent: its
shape) or "ndarray" (extent: the argument index), where = "file:line:col" or "".

Everything above is schema-checked when read (`check_kernel_meta`): a malformed record is
refused with a ValueError naming the record, never trusted at launch.

On disk (see runtime/cache.py for the layout) every metadata file is a *record*: a msgpack
array `["qdc", kind, FORMAT_VERSION, sha256(payload), payload]` whose payload is the msgpack
of a plain dict. The header can be read whatever the version; the checksum catches a
corrupt byte anywhere in the payload; a record of another version is refused (the cache
reports a CacheError asking for a rebuild). Records hold only str/int/float/bool/bytes/
list/dict: decoding one never runs code. Each binary artifact's sha256 is recorded in its
kernel's entry record and checked before the artifact is used.

Vector and matrix parameters (`v: qd.math.vec3`, passed by value) are scalar records, one per
element, row-major and consecutive, each with the parameter's name and its element shape as
the 7th entry (absent on every other scalar record, so metadata without them reads as
before); `KernelMeta.arguments` groups the records into the kernel's arguments. Everything
indexed by parameter (ctx slots, `ScalarArg`, bindings, debug checks, SPIR-V "args" words)
counts records, so backends see scalars only.

Struct parameters (`s: MyStruct`, passed by value) are scalar records too, one per scalar of
the struct (members in declaration order, nested structs flattened, vector/matrix members
row-major), consecutive, each with the parameter's name and [the struct's scalar count] as
7th entry, as a vector's; their types may differ. "structs" (only in kernels with struct
parameters) maps each such parameter to its layout, {"name": the struct's name, "members":
[[member, [dtype, shape] or a nested layout], ...]}, whose scalars in that order must be the
records' types (check_struct_layout). A kernel returning a struct has its members' values
in "returns" (one [dtype, shape] value per scalar or vector/matrix member) and "structs":
[[first value, layout]] there groups them back into one returned struct each.

Dataclass parameters and arrays inside template arguments (the compiler's
frontend/host_objects.py): "members" (absent otherwise) maps each parameter read off an
argument to its path, [argument, attribute or index, ...]; the launch function takes the
argument and reads the parameter from it at every launch (runtime/member_arguments.py);
"signature" lists the arguments that launch takes, in call order.

Bump FORMAT_VERSION whenever this layout or the metadata schema changes incompatibly. Version 4: task
records with entry, iterations, launch policy and adstack ids (version 3's `range` is gone);
adstack records without "iterations"/"parallel_from"; temporaries and error words in device
memory.
"""
from __future__ import annotations

import hashlib
import re

import msgpack

from . import sizeexpr
from .print_buffer import check_message_record
from .spirv_args import GRID_TEMPS

FORMAT_VERSION = 4

RECORD_MAGIC = "qdc"
ENTRY_RECORD = "kernel-entry"
MODULE_RECORD = "module"

DTYPE_NAMES = frozenset(("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "f32", "f64", "u1"))
# A kernel is compiled in variants; the reverse-mode one is stored as "<kernel>.grad", the
# forward-mode one (Jacobian-vector products) as "<kernel>.forward_ad". In a forward_ad
# entry, a field record named "<field>.dual" (is_grad true) is that field's dual, and an
# ndarray's gradient word carries the argument's dual.
VARIANTS = ("forward", "grad", "forward_ad")
GRAD_SUFFIX = ".grad"
FORWARD_AD_SUFFIX = ".forward_ad"
DUAL_SUFFIX = ".dual"
VARIANT_SUFFIXES = {"grad": GRAD_SUFFIX, "forward_ad": FORWARD_AD_SUFFIX}


def split_variant(name: str) -> tuple[str, str]:
    """A module record's kernel name -> (kernel, variant): 'f.grad' is the reverse-mode variant of f."""
    for variant, suffix in VARIANT_SUFFIXES.items():
        if name.endswith(suffix):
            return name[:-len(suffix)], variant
    return name, "forward"


def secondary_field(name: str) -> tuple[str, str | None]:
    """A field record's name -> (the declared field, None | "grad" | "dual")."""
    for kind, suffix in (("grad", GRAD_SUFFIX), ("dual", DUAL_SUFFIX)):
        if name.endswith(suffix):
            return name[:-len(suffix)], kind
    return name, None


class ParamMeta:
    """One kernel parameter. `needs_grad` (ndarrays): True, False, or None for an annotation
    that follows the argument, built without one (ahead of time: there was no argument to
    follow). `writes`: whether the kernel stores into the ndarray's own elements (not its
    .grad), so a read-only array must be refused; metadata written before it existed reads
    as True. `element_shape`: an ndarray of vectors/matrices has it as its last axes (counted in
    `ndim`); a scalar record with one is an element of a vector/matrix parameter (see the module
    docstring); the record's 7th entry, absent otherwise."""
    __slots__ = ("name", "kind", "dtype", "ndim", "needs_grad", "writes", "element_shape", "slot", "layout")

    def __init__(self, name, kind, dtype, ndim=0, needs_grad=False, writes=True, element_shape=(), slot=0,
                 layout=None):
        self.name, self.kind, self.dtype, self.ndim = name, kind, dtype, ndim
        self.needs_grad, self.writes, self.slot = needs_grad, writes, slot
        self.element_shape = tuple(element_shape)
        # an ndarray stored with its axes permuted (KernelMeta "layouts"): the storage order of its
        # own axes, which the kernel was compiled for; its shape words are in that order
        self.layout = None if layout is None else tuple(layout)

    @property
    def words(self) -> int:
        return 1 if self.kind == "scalar" else 1 + self.ndim + (1 if self.needs_grad else 0)

    @property
    def is_element(self) -> bool:
        """Whether the record is one element of a vector/matrix parameter."""
        return self.kind == "scalar" and bool(self.element_shape)


class ArgumentMeta:
    """One argument of the kernel's call: its records are `params[first:first + count]` (one
    record, or a vector/matrix parameter's elements, row-major)."""
    __slots__ = ("name", "first", "count", "element_shape")

    def __init__(self, name: str, first: int, count: int, element_shape: tuple):
        self.name, self.first, self.count, self.element_shape = name, first, count, element_shape


def element_count(shape) -> int:
    count = 1
    for n in shape:
        count *= n
    return count


def group_arguments(params: list) -> list[ArgumentMeta]:
    """The kernel's arguments from its parameter records (ParamMeta; see the module docstring)."""
    arguments, i = [], 0
    while i < len(params):
        p = params[i]
        shape = p.element_shape if p.is_element else ()
        count = element_count(shape)
        arguments.append(ArgumentMeta(p.name, i, count, shape))
        i += count
    return arguments


class FieldMeta:
    __slots__ = ("name", "dtype", "shape", "is_grad")

    def __init__(self, name, dtype, shape, is_grad=False):
        self.name, self.dtype, self.shape, self.is_grad = name, dtype, tuple(shape), is_grad


class TaskMeta:
    """One task of a kernel (format v4, see the module docstring): `entry` is its own entry
    point, `iterations` its trip count as a SizeExpr node list ([] = not expressible),
    `launch` the target's launch policy, `adstacks` the ids of the stacks it holds."""
    __slots__ = ("name", "kind", "serial", "source_kind", "entry", "iterations", "launch", "adstacks", "bindings")

    def __init__(self, name, kind, serial, source_kind, entry="", iterations=None, launch=None, adstacks=None,
                 bindings=None):
        self.name, self.kind, self.serial, self.source_kind = name, kind, serial, source_kind
        self.entry = entry
        self.iterations = iterations or []
        self.launch = launch or {"policy": "cpu_chunks", "parallel_from": 0}
        self.adstacks = adstacks or []
        self.bindings = bindings or []  # descriptor bindings of targets that have them (SPIR-V)

    def to_dict(self) -> dict:
        d = {"name": self.name, "kind": self.kind, "serial": self.serial, "source_kind": self.source_kind,
             "entry": self.entry, "iterations": self.iterations, "launch": self.launch,
             "adstacks": self.adstacks}
        if self.bindings:  # absent on targets that pass pointers (cpu, cuda, amdgpu)
            d["bindings"] = self.bindings
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TaskMeta":
        return cls(d["name"], d["kind"], d["serial"], d["source_kind"], d["entry"], d["iterations"],
                   d["launch"], d["adstacks"], d.get("bindings"))


class KernelMeta:
    """Everything the runtime needs to bind arguments and launch one compiled kernel."""

    def __init__(self, name: str, entry: str, params: list, fields: list, tasks: list,
                 num_temps: int = 0, is_grad: bool = False, adstack: dict | None = None,
                 debug_checks: list | None = None, cpu_libraries: list | None = None, returns: dict | None = None,
                 random: bool = False, messages: list | None = None, structs: dict | None = None,
                 members: dict | None = None, signature: list | None = None, graph_loops: list | None = None):
        self.name, self.entry = name, entry
        # qd.graph.do_while loops: [first task, end task, flag parameter] each (see the docstring)
        self.graph_loops = graph_loops or []
        self.members = members or {}  # parameter -> the path it is read from (see the module docstring)
        self.signature = list(signature) if signature is not None else None  # with members: the arguments
        self.structs = structs or {}  # struct parameter -> its layout (see the module docstring)
        self.returns = returns  # the "returns" record, None when the kernel returns nothing
        self.cpu_libraries = cpu_libraries or []  # CPU entries: one record per library, see the docstring
        self.params, self.fields, self.tasks = params, fields, tasks
        self.arguments = group_arguments(params)
        self.num_temps, self.is_grad = num_temps, is_grad
        self.adstack = adstack or {}
        slot = 0
        for p in params:
            p.slot = slot
            slot += p.words
        self.field_slot0 = slot
        self.temps_slot = slot + len(fields)
        self.threads_slot = self.temps_slot + 1
        self.ctx_words = self.threads_slot + 1
        stacks = self.adstack.get("stacks") or []
        self.adstack_slot = self.ctx_words if stacks else None  # runtime/adstack.py writes these words
        self.adstack_threads_slot = self.ctx_words + 3 + 2 * len(stacks) if stacks else None
        self.ctx_words += 4 + 2 * len(stacks) if stacks else 0
        self.debug_checks = debug_checks or []
        self.debug_slot = self.ctx_words if self.debug_checks else None  # runtime/contract/bounds.py writes it
        self.ctx_words += 1 if self.debug_checks else 0
        self.random = random
        self.random_slot = self.ctx_words if random else None  # runtime/random_stream.py writes these words
        self.ctx_words += 2 if random else 0
        self.messages = messages or []  # print, assert and debug-check messages (contract/print_buffer.py)
        self.print_slot = self.ctx_words if self.messages else None  # the print buffer's address
        self.ctx_words += 1 if self.messages else 0

    def record_names(self) -> list[str]:
        """Each parameter record's name as messages show it: `v[1]` for an element of vector `v`."""
        names = []
        for a in self.arguments:
            if a.name in self.structs:
                names += [a.name + leaf for leaf in struct_scalar_names(self.structs[a.name])]
                continue
            if not a.element_shape:
                names.append(a.name)
                continue
            for k in range(a.count):
                position, rest = [], k
                for n in reversed(a.element_shape):
                    position.insert(0, rest % n)
                    rest //= n
                names.append(f"{a.name}[{', '.join(map(str, position))}]")
        return names

    def to_dict(self) -> dict:
        d = {
            "name": self.name, "entry": self.entry, "num_temps": self.num_temps,
            "is_grad": self.is_grad, "adstack": self.adstack,
            "params": [[p.name, p.kind, p.dtype, p.ndim, p.needs_grad, p.writes]
                       + ([list(p.element_shape)] if p.element_shape else []) for p in self.params],
            "fields": [[f.name, f.dtype, list(f.shape), f.is_grad] for f in self.fields],
            "tasks": [t.to_dict() for t in self.tasks],
        }
        if self.debug_checks:  # absent without debug: such metadata reads as before
            d["debug_checks"] = self.debug_checks
        if self.cpu_libraries:
            d["cpu_libraries"] = self.cpu_libraries
        if self.random:  # absent when the kernel does not draw: such metadata reads as before
            d["random"] = True
        if self.returns:  # absent when the kernel returns nothing: such metadata reads as before
            d["returns"] = self.returns
        if self.messages:  # absent without print or debug checks: such metadata reads as before
            d["messages"] = self.messages
        if self.structs:  # absent without struct parameters: such metadata reads as before
            d["structs"] = self.structs
        if self.members:  # absent without dataclass parameters: such metadata reads as before
            d["members"] = self.members
            d["signature"] = self.signature
        layouts = [[i, list(p.layout)] for i, p in enumerate(self.params) if p.layout is not None]
        if layouts:  # absent without arrays stored with permuted axes: such metadata reads as before
            d["layouts"] = layouts
        if self.graph_loops:  # absent without qd.graph.do_while: such metadata reads as before
            d["graph_loops"] = self.graph_loops
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "KernelMeta":
        """Rebuild from a dict that may come from a cache file: every value is checked
        (ValueError on anything malformed) so bad metadata fails here, not at launch."""
        check_kernel_meta(d)
        params = [ParamMeta(*p) for p in d["params"]]
        for i, layout in d.get("layouts", []):
            params[i].layout = tuple(layout)
        return cls(d["name"], d["entry"],
                   params,
                   [FieldMeta(*f) for f in d["fields"]],
                   [TaskMeta.from_dict(t) for t in d["tasks"]],
                   d["num_temps"], d["is_grad"], d.get("adstack") or {}, d.get("debug_checks") or [],
                   d.get("cpu_libraries") or [], d.get("returns"), d.get("random", False),
                   d.get("messages") or [], d.get("structs") or {}, d.get("members") or {}, d.get("signature"),
                   d.get("graph_loops") or [])


# ---- records ------------------------------------------------------------------------------

class RecordError(ValueError):
    """A metadata record is unreadable; `version_mismatch` tells stale from corrupt."""

    def __init__(self, message: str, version_mismatch: bool = False):
        super().__init__(message)
        self.version_mismatch = version_mismatch


def encode_record(kind: str, body: dict) -> bytes:
    payload = msgpack.packb(body, use_bin_type=True)
    return msgpack.packb([RECORD_MAGIC, kind, FORMAT_VERSION, sha256(payload), payload], use_bin_type=True)


def decode_record(data: bytes, kind: str) -> dict:
    """The dict inside a record of `kind`; RecordError if it is corrupt or another version."""
    try:
        head = msgpack.unpackb(data, raw=False)
    except Exception as e:  # msgpack raises several types on garbage; all mean "corrupt"
        raise RecordError(f"not a readable qdc metadata record ({type(e).__name__})") from None
    if not (isinstance(head, list) and len(head) == 5 and head[0] == RECORD_MAGIC):
        raise RecordError("not a qdc metadata record (bad header)")
    _, got_kind, version, digest, payload = head
    if got_kind != kind:
        raise RecordError(f"expected a '{kind}' record, found '{got_kind}'")
    if version != FORMAT_VERSION:
        raise RecordError(f"written by artifact format version {version}, this qdc reads version "
                          f"{FORMAT_VERSION}; rebuild it with `qdc build`", version_mismatch=True)
    if not isinstance(payload, bytes) or sha256(payload) != digest:
        raise RecordError("metadata checksum mismatch: the file is corrupt")
    try:
        body = msgpack.unpackb(payload, raw=False)
    except Exception as e:
        raise RecordError(f"metadata payload unreadable ({type(e).__name__})") from None
    if not isinstance(body, dict):
        raise RecordError("metadata payload is not a map")
    return body


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---- schema checks (the runtime trusts nothing it reads from disk) ------------------------

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # a native symbol: entries, task names
_NAME = re.compile(r"^[^\W\d]\w*$")  # a Python identifier (non-ASCII letters too): kernels, parameters, members
KEY_RE = re.compile(r"^[0-9a-f]{64}$")
ARTIFACT_FILE_RE = re.compile(r"^kernel\.[a-z0-9_]{1,16}$")


def _need(cond, what):
    if not cond:
        raise ValueError(f"malformed metadata: {what}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_layouts(layouts, params) -> None:
    """Each entry: [index of an ndarray parameter, a permutation of its own (non-element) axes]."""
    _need(isinstance(layouts, list), "layouts")
    for entry in layouts:
        _need(isinstance(entry, list) and len(entry) == 2 and _is_int(entry[0]) and 0 <= entry[0] < len(params)
              and params[entry[0]][1] == "ndarray" and isinstance(entry[1], list), f"layout entry {entry!r:.60}")
        p = params[entry[0]]
        own = p[3] - (len(p[6]) if len(p) == 7 else 0)
        _need(sorted(a for a in entry[1] if _is_int(a)) == list(range(own)), f"layout of parameter {p[0]!r}")


def check_kernel_meta(d) -> None:
    _need(isinstance(d, dict), "kernel meta is not a map")
    _need(isinstance(d.get("name"), str) and _NAME.match(d["name"]), "kernel name")
    _need(isinstance(d.get("entry"), str) and _IDENT.match(d["entry"]), "entry symbol")
    _need(_is_int(d.get("num_temps")) and 0 <= d["num_temps"] < 1 << 20, "num_temps")
    _need(isinstance(d.get("is_grad"), bool), "is_grad")
    _need(isinstance(d.get("adstack", {}), dict), "adstack")
    _need(isinstance(d.get("adstack", {}).get("stacks", []), list), "adstack stacks")
    _need(isinstance(d.get("params"), list), "params")
    structs = d.get("structs", {})
    _need(isinstance(structs, dict) and all(isinstance(k, str) for k in structs), "structs")
    for p in d["params"]:  # 5 wide: written before `writes` existed (then True)
        _need(isinstance(p, list) and len(p) in (5, 6, 7), "an entry of params")
        _need(isinstance(p[0], str) and _NAME.match(p[0]) and p[1] in ("scalar", "ndarray")
              and p[2] in DTYPE_NAMES and _is_int(p[3]) and 0 <= p[3] <= 16
              and (p[4] is None or isinstance(p[4], bool)) and (len(p) == 5 or isinstance(p[5], bool)),
              f"parameter {p[0]!r}")
        # an ndarray's element axes are among its dimensions; a vector parameter's elements are records
        axes, largest = (2, MAX_ELEMENT_AXIS) if p[1] == "scalar" else (min(2, p[3]), float("inf"))
        if p[1] == "scalar" and p[0] in structs:  # a struct's scalars: [their count]
            axes, largest = 1, MAX_STRUCT_SCALARS
        _need(len(p) < 7 or (isinstance(p[6], list) and 0 < len(p[6]) <= axes
                             and all(_is_int(s) and 0 < s <= largest for s in p[6])),
              f"element shape of parameter {p[0]!r}")
    _check_arguments(d["params"], structs)
    _check_members(d.get("members", {}), d["params"], d.get("signature"))
    _check_layouts(d.get("layouts", []), d["params"])
    for f in _list(d, "fields", 4):
        check_field(f[0], f[1], f[2], module_attribute=False)
        _need(isinstance(f[3], bool), f"field {f[0]!r}")
    _need(isinstance(d.get("tasks"), list) and len(d["tasks"]) <= MAX_TASKS, "tasks")
    for i, t in enumerate(d["tasks"]):
        check_task_record(d, i, t)
    for i, r in enumerate(d.get("adstack", {}).get("stacks", [])):
        check_adstack_record(d, i, r)
    _check_task_stacks(d)
    _need(isinstance(d.get("debug_checks", []), list), "debug_checks")
    _need(isinstance(d.get("random", False), bool), "random")
    _need(isinstance(d.get("messages", []), list) and len(d.get("messages", [])) <= MAX_MESSAGES, "messages")
    for i, r in enumerate(d.get("messages", [])):
        check_message_record(i, r)
    for i, r in enumerate(d.get("debug_checks", [])):
        check_debug_record(d, i, r)
    _need(isinstance(d.get("cpu_libraries", []), list) and len(d.get("cpu_libraries", [])) <= 16, "cpu_libraries")
    for i, r in enumerate(d.get("cpu_libraries", [])):
        check_cpu_library_record(i, r)
    if "returns" in d:
        check_returns_record(d, d["returns"])
    _check_graph_loops(d)


def _check_graph_loops(d: dict) -> None:
    """Each qd.graph.do_while record [first, end, flag]: a non-empty run of the kernel's tasks
    and a 0-d i32 ndarray parameter; two loops are disjoint or one holds the other."""
    loops = d.get("graph_loops", [])
    _need(isinstance(loops, list) and len(loops) <= MAX_TASKS, "graph_loops")
    params = d["params"]
    for r in loops:
        _need(isinstance(r, list) and len(r) == 3 and all(_is_int(v) for v in r)
              and 0 <= r[0] < r[1] <= len(d["tasks"]) and 0 <= r[2] < len(params)
              and params[r[2]][1] == "ndarray" and params[r[2]][2] == "i32" and params[r[2]][3] == 0,
              f"graph_loops record {r!r:.60}")
    for a in loops:
        for b in loops:
            _need(a[1] <= b[0] or b[1] <= a[0] or (a[0] <= b[0] and b[1] <= a[1]) or (b[0] <= a[0] and a[1] <= b[1]),
                  "graph_loops overlap")


MAX_MESSAGES = 1 << 16  # print, assert and debug-check messages of one kernel
MAX_ELEMENT_AXIS = 64  # a vector's length, a matrix's rows or columns


def _check_arguments(params: list, structs: dict) -> None:
    """A vector/matrix parameter's element records are consecutive, all of one dtype and
    shape, as many as its elements; a struct parameter's are its layout's scalars; argument
    names are distinct, and "structs" names struct parameters only."""
    names, i = set(), 0
    while i < len(params):
        p = params[i]
        shape = p[6] if len(p) == 7 and p[1] == "scalar" else []
        count = element_count(shape)
        if p[0] in structs:
            dtypes = check_struct_layout(structs[p[0]], f"struct parameter {p[0]!r}")
            group = params[i:i + len(dtypes)]
            _need(shape == [len(dtypes)] and len(group) == len(dtypes)
                  and all(len(q) == 7 and q[0] == p[0] and q[1] == "scalar" and q[3] == 0 and q[6] == shape
                          and q[2] == dtype for q, dtype in zip(group, dtypes)),
                  f"the scalar records of struct parameter {p[0]!r}")
        elif shape:
            group = params[i:i + count]
            _need(len(group) == count and all(len(q) == 7 and q[:4] == p[:4] and q[6] == shape for q in group),
                  f"the element records of vector parameter {p[0]!r}")
        _need(p[0] not in names, f"parameter {p[0]!r} appears twice")
        names.add(p[0])
        i += count
    _need(set(structs) <= names, "structs: a struct parameter the kernel does not have")


def _check_members(members, params: list, signature) -> None:
    """"members": parameter name -> [argument, step, ...], each step an attribute (an
    identifier) or an index (an int), naming a scalar or ndarray parameter the kernel has;
    "signature" (with members): the distinct argument names the launch takes, in order."""
    _need(isinstance(members, dict), "members")
    _need(not members or (isinstance(signature, list) and len(signature) <= 1024
                          and all(isinstance(n, str) and _NAME.match(n) for n in signature)
                          and len(set(signature)) == len(signature)), "signature")
    kinds = {p[0]: p[1] for p in params}
    for name, path in members.items():
        _need(isinstance(name, str) and kinds.get(name) in ("scalar", "ndarray") and isinstance(path, list)
              and 0 < len(path) <= 64 and isinstance(path[0], str) and _NAME.match(path[0])
              and all((isinstance(s, str) and _NAME.match(s)) or (_is_int(s) and 0 <= s < 1 << 20)
                      for s in path[1:]), f"members: parameter {name!r:.60}")


MAX_STRUCT_SCALARS = 4096  # the scalars of one struct parameter or returned struct
MAX_STRUCT_DEPTH = 16  # structs nested in structs


def check_struct_layout(layout, what: str, largest_axis: int = MAX_ELEMENT_AXIS,
                        most_scalars: int = MAX_STRUCT_SCALARS, depth: int = 0) -> list:
    """A struct layout (see the module docstring); the dtype of each of its scalars, in order.
    A parameter's vector members are as a vector parameter's (rows and columns up to
    MAX_ELEMENT_AXIS), a returned struct's as a returned vector's."""
    _need(depth < MAX_STRUCT_DEPTH and isinstance(layout, dict) and set(layout) == {"name", "members"}
          and isinstance(layout["name"], str) and _NAME.match(layout["name"])
          and isinstance(layout["members"], list) and 0 < len(layout["members"]) <= most_scalars,
          f"{what}: layout")
    dtypes, seen = [], set()
    for m in layout["members"]:
        _need(isinstance(m, list) and len(m) == 2 and isinstance(m[0], str) and _NAME.match(m[0])
              and m[0] not in seen, f"{what}: a member")
        seen.add(m[0])
        if isinstance(m[1], dict):
            dtypes += check_struct_layout(m[1], what, largest_axis, most_scalars, depth + 1)
        else:
            leaf = m[1]
            _need(isinstance(leaf, list) and len(leaf) == 2 and leaf[0] in DTYPE_NAMES and isinstance(leaf[1], list)
                  and len(leaf[1]) <= 2 and all(_is_int(n) and 0 < n <= largest_axis for n in leaf[1]),
                  f"{what}: member {m[0]!r:.60}")
            dtypes += [leaf[0]] * element_count(leaf[1])
        _need(len(dtypes) <= most_scalars, f"{what}: more than {most_scalars} scalars")
    return dtypes


def struct_scalar_names(layout: dict) -> list[str]:
    """`.a`, `.v[0]`, `.inner.b`: how messages name each scalar of a (checked) struct layout."""
    names = []
    for member, sub in layout["members"]:
        if isinstance(sub, dict):
            names += [f".{member}{rest}" for rest in struct_scalar_names(sub)]
            continue
        shape = sub[1]
        if not shape:
            names.append(f".{member}")
            continue
        for k in range(element_count(shape)):
            position, rest = [], k
            for n in reversed(shape):
                position.insert(0, rest % n)
                rest //= n
            names.append(f".{member}[{', '.join(map(str, position))}]")
    return names


MAX_RETURN_VALUES = 4096
# The scalars a kernel returns (every component of every value) each travel in a kernel
# temporary of their own (`num_temps` < 2**20): this bound leaves the kernel's other
# temporaries ample room. The front end refuses a return type beyond it.
MAX_RETURN_SCALARS = 1 << 16


def check_returns_record(d: dict, r) -> None:
    """The "returns" record: per returned item [dtype, element shape] (shape [] for a scalar,
    [n] for a vector, [n, m] for a matrix), whether the items form a tuple, and the temporary
    slot of every scalar, items in order and each element row-major."""
    _need(isinstance(r, dict) and set(r) - {"structs"} == {"values", "tuple", "slots"} and isinstance(r["tuple"], bool)
          and isinstance(r["values"], list) and 0 < len(r["values"]) <= MAX_RETURN_VALUES, "returns")
    _need(r["tuple"] or return_items(r) == 1, "returns: one item unless a tuple")
    counts = []
    for v in r["values"]:
        _need(isinstance(v, list) and len(v) == 2 and v[0] in DTYPE_NAMES and isinstance(v[1], list)
              and len(v[1]) <= 2 and all(_is_int(n) and 0 < n <= MAX_RETURN_SCALARS for n in v[1]),
              f"returns: value {v!r:.60}")
        counts.append(v[1][0] * (v[1][1] if len(v[1]) == 2 else 1) if v[1] else 1)
    _need(sum(counts) <= MAX_RETURN_SCALARS, f"returns: {sum(counts)} scalars, more than {MAX_RETURN_SCALARS}")
    slots = r["slots"]
    _need(isinstance(slots, list) and len(slots) == sum(counts) and len(set(slots)) == len(slots)
          and all(_is_int(s) and 0 <= s < d["num_temps"] for s in slots), "returns: slots")
    start = 0
    for count in counts:  # the scalars of one value are in consecutive temporaries
        _need(slots[start:start + count] == list(range(slots[start], slots[start] + count)),
              "returns: the slots of a value are not consecutive")
        start += count


def return_items(r: dict) -> int:
    """How many items a "returns" record's values make (a struct's values are one), after
    checking its "structs" groups: [first value, layout] in order, not overlapping, each
    layout's members being the values there."""
    values, structs = r["values"], r.get("structs", [])
    _need(isinstance(structs, list) and len(structs) <= MAX_RETURN_VALUES, "returns: structs")
    items, next_free = len(values), 0
    for g in structs:
        _need(isinstance(g, list) and len(g) == 2 and _is_int(g[0]) and next_free <= g[0] < len(values),
              "returns: a struct group")
        check_struct_layout(g[1], "returns: struct", MAX_RETURN_SCALARS, MAX_RETURN_SCALARS)
        leaves = _layout_values(g[1])
        _need(values[g[0]:g[0] + len(leaves)] == leaves, "returns: a struct's values")
        next_free = g[0] + len(leaves)
        items -= len(leaves) - 1
    return items


def _layout_values(layout: dict) -> list:
    """A checked struct layout's member values as "returns" records them: [dtype, shape] each."""
    out = []
    for _, sub in layout["members"]:
        out += _layout_values(sub) if isinstance(sub, dict) else [[sub[0], list(sub[1])]]
    return out


_FEATURE_NAME = re.compile(r"^[a-z0-9][a-z0-9._+-]{0,63}$")


def check_cpu_library_record(i: int, r) -> None:
    """CPU library record `i` (see the module docstring)."""
    _need(isinstance(r, dict) and isinstance(r.get("artifact"), str)
          and ARTIFACT_FILE_RE.match("kernel." + r["artifact"])
          and isinstance(r.get("target"), str) and 0 < len(r["target"]) <= 64
          and isinstance(r.get("machine"), str) and _FEATURE_NAME.match(r["machine"])
          and isinstance(r.get("features"), list) and len(r["features"]) <= 256
          and all(isinstance(f, str) and _FEATURE_NAME.match(f) for f in r["features"])
          and ("level" not in r or (_is_int(r["level"]) and 0 <= r["level"] < 16))
          and all(key not in r or (isinstance(r[key], str) and _FEATURE_NAME.match(r[key])) for key in ("os", "triple")),
          f"cpu library record {i}")


def check_debug_record(d: dict, i: int, r) -> None:
    """Bounds-check record `i` (see the module docstring): names a field shape or an ndarray
    parameter of the kernel."""
    _need(isinstance(r, list) and len(r) == 5 and r[0] in ("field", "ndarray") and isinstance(r[1], str)
          and isinstance(r[2], bool) and isinstance(r[4], str) and len(r[1]) <= 256 and len(r[4]) <= 4096,
          f"debug check {i}")
    if r[0] == "field":
        _need(isinstance(r[3], list) and 0 < len(r[3]) <= 16 and all(_is_int(n) and n >= 0 for n in r[3]),
              f"debug check {i}: shape")
    else:
        params = d["params"]
        _need(_is_int(r[3]) and 0 <= r[3] < len(params) and params[r[3]][1] == "ndarray",
              f"debug check {i}: ndarray argument")


MAX_ADSTACK_CAPACITY = 1 << 40
MAX_TASKS = 0xFFFF  # the overflow word's 16-bit task field
TASK_KINDS = ("serial", "range_for")
LAUNCH_POLICIES = {
    # CPU: chunks of the range over worker threads from `parallel_from` iterations (0: never)
    "cpu_chunks": {"parallel_from"},
    # GPU: one dispatch of ceil(iterations / block_dim) blocks of block_dim threads (block_dim 0:
    # the device's default)
    "grid": {"block_dim"},
}
_TASK_KEYS = {"name", "kind", "serial", "source_kind", "entry", "iterations", "launch", "adstacks"}
# What a descriptor binding holds: [set, binding, resource, index]; index is the field's or the
# ndarray parameter's position for those resources, 0 for the others.
BINDING_RESOURCES = ("field", "ndarray", "ndarray_grad", "args", "temps", "errors", "adstack_meta",
                     "adstack_float", "adstack_int", "print", "addresses")
ARRAY_RESOURCES = ("field", "ndarray", "ndarray_grad")


def check_task_record(d: dict, i: int, t) -> None:
    """Task record `i` (see the module docstring): its entry symbol, trip count, launch policy
    and the ids of its adstacks."""
    what = f"task record {i}"
    _need(isinstance(t, dict) and _TASK_KEYS <= set(t) <= _TASK_KEYS | {"bindings"},
          f"{what}: expected the keys {sorted(_TASK_KEYS)} (and optionally bindings)")
    _need(isinstance(t["name"], str) and _IDENT.match(t["name"]) and t["kind"] in TASK_KINDS
          and isinstance(t["serial"], bool) and isinstance(t["source_kind"], str) and len(t["source_kind"]) <= 64,
          f"{what} ({t['name']!r:.40})")
    _need(isinstance(t["entry"], str) and _IDENT.match(t["entry"]), f"{what}: entry symbol")
    check_launch_policy(t["launch"], what)
    _need(isinstance(t["adstacks"], list) and len(t["adstacks"]) <= 0xFFFF
          and all(_is_int(s) and s >= 0 for s in t["adstacks"])
          and len(set(t["adstacks"])) == len(t["adstacks"]), f"{what}: adstacks")
    try:
        expr = sizeexpr.from_nodes(t["iterations"])
    except ValueError as e:
        raise ValueError(f"malformed metadata: {what}, iterations: {e}") from None
    _need(expr is not None or t["kind"] == "range_for", f"{what}: a serial task runs once, its iterations are [1]")
    if expr is not None:
        _check_size_expr_refs(d, expr, f"{what}, iterations")
    if "bindings" in t:
        check_bindings(d, t["bindings"], what)
    if "addressed" in t["launch"]:
        addressed = t["launch"]["addressed"]
        _need(isinstance(addressed, list) and 0 < len(addressed) <= 4096
              and all(isinstance(a, list) and len(a) == 2 and a[0] in ARRAY_RESOURCES and _is_int(a[1])
                      for a in addressed)
              and len({tuple(a) for a in addressed}) == len(addressed), f"{what}: launch policy addressed")
        check_array_references(d, [[0, 0, *a] for a in addressed], f"{what}: addressed")
    if "grid_temp" in t["launch"]:
        slot = t["launch"]["grid_temp"]
        _need(t["kind"] == "range_for" and _is_int(slot) and 0 <= slot and slot + GRID_TEMPS <= d["num_temps"],
              f"{what}: launch policy grid_temp")


def check_bindings(d: dict, bindings, what: str) -> None:
    """A task's descriptor bindings: distinct (set, binding) slots, each naming a resource the
    kernel has (a field, an ndarray parameter or its gradient, or a runtime-owned buffer)."""
    _need(isinstance(bindings, list) and 0 < len(bindings) <= 4096, f"{what}: bindings")
    seen = set()
    for b in bindings:
        _need(isinstance(b, list) and len(b) == 4 and all(_is_int(v) for v in (b[0], b[1], b[3]))
              and 0 <= b[0] < 8 and 0 <= b[1] < 1024 and b[2] in BINDING_RESOURCES and (b[0], b[1]) not in seen,
              f"{what}: binding {b!r:.60}")
        seen.add((b[0], b[1]))
    check_array_references(d, bindings, what)


def check_array_references(d: dict, bindings, what: str) -> None:
    """Each field, ndarray or ndarray gradient a binding names is one of the kernel's."""
    params = d["params"]
    for b in bindings:
        kind, index = b[2], b[3]
        if kind == "field":
            _need(0 <= index < len(d["fields"]), f"{what}: binding {b!r:.60} names no field of the kernel")
        elif kind in ("ndarray", "ndarray_grad"):
            _need(0 <= index < len(params) and params[index][1] == "ndarray"
                  and (kind == "ndarray" or params[index][4]), f"{what}: binding {b!r:.60} names no such ndarray")
        else:
            _need(index == 0, f"{what}: binding {b!r:.60}")


# Keys a policy may add: the CPU's width-W lowering (compiler/targets/cpu/widen_codegen.py)
# records "lanes" (adstack heap slices one thread takes; "lanes_reason": why that few) or "scalar"
# (why the task is not widened). A GPU task with block-level code records the subgroup size it was
# built for ("subgroup_size"), which a device of another size refuses.
# A task that reaches its arrays by buffer device address lists them ("addressed": [[resource,
# index], ...], compiler/targets/vulkan/target.py). A SPIR-V task computing its grid on the device
# names the temporaries it writes it to ("grid_temp", runtime/contract/spirv_args.py).
OPTIONAL_LAUNCH_KEYS = {"cpu_chunks": {"lanes", "lanes_reason", "scalar"},
                        "grid": {"subgroup_size", "addressed", "grid_temp"}}


def check_launch_policy(launch, what: str) -> None:
    _need(isinstance(launch, dict) and launch.get("policy") in LAUNCH_POLICIES
          and set(launch) - OPTIONAL_LAUNCH_KEYS[launch["policy"]] == LAUNCH_POLICIES[launch["policy"]] | {"policy"},
          f"{what}: launch policy")
    if launch["policy"] == "cpu_chunks":
        _need(_is_int(launch["parallel_from"]) and 0 <= launch["parallel_from"] <= 1 << 62,
              f"{what}: launch policy parallel_from")
        _need(_is_int(launch.get("lanes", 1)) and 1 <= launch.get("lanes", 1) <= 64, f"{what}: launch policy lanes")
        for key in ("scalar", "lanes_reason"):
            _need(isinstance(launch.get(key, ""), str) and len(launch.get(key, "")) <= 200,
                  f"{what}: launch policy {key}")
    else:
        # 0: the device's default block size (no qd.loop_config(block_dim=...) on the loop)
        _need(_is_int(launch["block_dim"]) and 0 <= launch["block_dim"] <= 1 << 16, f"{what}: launch policy block_dim")
        _need(_is_int(launch.get("subgroup_size", 1)) and 1 <= launch.get("subgroup_size", 1) <= 128,
              f"{what}: launch policy subgroup_size")


def _check_task_stacks(d: dict) -> None:
    """Each adstack is listed by exactly the task its record names."""
    stacks = d.get("adstack", {}).get("stacks", [])
    listed = sorted((s, i) for i, t in enumerate(d["tasks"]) for s in t["adstacks"])
    _need(listed == sorted((s, r["task"]) for s, r in enumerate(stacks)),
          "the tasks' adstack ids do not match the adstack records")


def check_adstack_record(d: dict, i: int, r) -> None:
    """Stack record `i` of kernel meta dict `d` (see the module docstring), its SizeExpr tree
    included: well-formed, and reading only parameters and fields the kernel has, with as
    many indices as they have dimensions."""
    what = f"adstack record {i}"
    _need(isinstance(r, dict) and _is_int(r.get("task")) and 0 <= r["task"] < len(d["tasks"])
          and r.get("dtype") in DTYPE_NAMES and isinstance(r.get("adjoint"), bool)
          and (not r["adjoint"] or r["dtype"][0] == "f") and _is_int(r.get("max_size"))
          and 1 <= r["max_size"] <= MAX_ADSTACK_CAPACITY and isinstance(r.get("name", ""), str)
          and "iterations" not in r and "parallel_from" not in r, what)
    try:
        expr = sizeexpr.from_nodes(r.get("size_expr", []))
    except ValueError as e:
        raise ValueError(f"malformed metadata: {what}, size_expr: {e}") from None
    if expr is not None:
        _need(not sizeexpr.reads_temps(expr), f"{what}, size_expr: reads a kernel temporary")
        _check_size_expr_refs(d, expr, f"{what}, size_expr")


def _check_size_expr_refs(d: dict, expr, what: str) -> None:
    params, fields = d["params"], d["fields"]
    for e in sizeexpr.walk(expr):
        if isinstance(e, sizeexpr.ScalarArg):
            ok = e.arg < len(params) and params[e.arg][1] == "scalar" and params[e.arg][2][0] in "iu"
        elif isinstance(e, (sizeexpr.NdarrayShape, sizeexpr.NdarrayRead)):
            ok = e.arg < len(params) and params[e.arg][1] == "ndarray"
            if ok and isinstance(e, sizeexpr.NdarrayShape):
                ok = e.axis < params[e.arg][3]
            elif ok:
                ok = len(e.indices) == params[e.arg][3] and params[e.arg][2][0] in "iu"
        elif isinstance(e, sizeexpr.FieldLoad):
            ok = e.slot < len(fields) and len(e.indices) == len(fields[e.slot][2]) and fields[e.slot][1][0] in "iu"
        elif isinstance(e, sizeexpr.TempRead):
            ok = e.slot < d["num_temps"]
        else:
            continue
        _need(ok, f"{what}: `{sizeexpr.to_text(e)}` reads a parameter or field the kernel does not have")


def check_field(name, dtype, shape, module_attribute=True) -> None:
    """A field declaration; a module's own fields become attributes, so need identifier names."""
    if module_attribute:
        _need(isinstance(name, str) and _IDENT.match(name), f"field name {name!r}")
    else:
        _need(isinstance(name, str) and 0 < len(name) <= 256, f"field name {name!r}")
    _need(dtype in DTYPE_NAMES, f"dtype of field {name!r}")
    _need(isinstance(shape, list) and len(shape) <= 16 and all(_is_int(s) and s >= 0 for s in shape),
          f"shape of field {name!r}")


def check_element_shapes(body: dict) -> None:
    """Optional "element_shapes" of a module record: {field name: element shape} for fields of
    vectors/matrices, whose records give the full (storage) shape ending in the element's."""
    shapes = body.get("element_shapes", {})
    _need(isinstance(shapes, dict), "element_shapes")
    storage = {f[0]: f[2] for f in body["fields"]}
    for name, shape in shapes.items():
        _need(name in storage, f"element_shapes names no field {name!r:.60}")
        _need(isinstance(shape, list) and 0 < len(shape) <= 2 and all(_is_int(s) and s > 0 for s in shape)
              and storage[name][len(storage[name]) - len(shape):] == shape, f"element shape of field {name!r}")


def _list(d, key, width):
    items = d.get(key)
    _need(isinstance(items, list), key)
    for item in items:
        _need(isinstance(item, list) and len(item) == width, f"an entry of {key}")
    return items


def check_entry_record(body: dict) -> None:
    """An entry record: kernel meta, field bindings and the artifacts with their hashes."""
    _need(isinstance(body.get("key"), str) and KEY_RE.match(body["key"]), "key")
    _need(body.get("variant") in VARIANTS, "variant")
    _need(isinstance(body.get("arch"), str), "arch")
    check_kernel_meta(body.get("meta"))
    refs = body.get("field_refs")
    _need(isinstance(refs, list) and len(refs) == len(body["meta"]["fields"]), "field_refs")
    for r in refs:
        _need(isinstance(r, list) and len(r) == 2 and _is_int(r[0]) and r[0] >= 0 and isinstance(r[1], bool),
              "a field_refs item")
    for w in body.get("warnings", []):
        _need(isinstance(w, list) and len(w) == 4 and all(isinstance(v, str) for v in w[:3]) and _is_int(w[3]),
              "a recorded warning")
    arts = body.get("artifacts")
    _need(isinstance(arts, dict) and arts, "artifacts")
    for kind, a in arts.items():
        _need(isinstance(a, dict) and isinstance(a.get("file"), str) and ARTIFACT_FILE_RE.match(a["file"])
              and isinstance(a.get("sha256"), str) and len(a["sha256"]) == 64 and _is_int(a.get("size")),
              f"artifact {kind!r}")
    for r in body["meta"].get("cpu_libraries", []):
        _need(r["artifact"] in arts, f"cpu library {r['target']!r}: artifact {r['artifact']!r} missing from the entry")


def check_module_record(body: dict) -> None:
    """A module record: the module's fields and, per kernel variant, its entry key."""
    _need(isinstance(body.get("module"), str), "module name")
    _need(isinstance(body.get("arch"), str), "arch")
    _need(isinstance(body.get("fields"), list), "fields")
    for f in body["fields"]:  # [name, dtype, shape, needs_grad(, needs_dual)]: 4 wide before forward mode
        _need(isinstance(f, list) and len(f) in (4, 5), "an entry of fields")
        check_field(f[0], f[1], f[2])
        _need(all(isinstance(v, bool) for v in f[3:]), f"field {f[0]!r}")
    check_element_shapes(body)
    kernels = body.get("kernels")
    _need(isinstance(kernels, dict), "kernels")
    for name, key in kernels.items():
        base = split_variant(name)[0] if isinstance(name, str) else name
        _need(isinstance(name, str) and _NAME.match(base), f"kernel name {name!r}")
        _need(isinstance(key, str) and KEY_RE.match(key), f"entry key of kernel {name!r}")
