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

Everything above is schema-checked when read (`check_kernel_meta`, runtime/contract/artifact_schema.py,
with the values records may hold): a malformed record is refused with a ValueError naming the
record, never trusted at launch.

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

import msgpack

from .artifact_schema import check_kernel_meta, element_count

FORMAT_VERSION = 4

RECORD_MAGIC = "qdc"
ENTRY_RECORD = "kernel-entry"
MODULE_RECORD = "module"



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
