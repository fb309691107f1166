"""The artifact format's schema: the values a metadata record may hold (dtype names, kernel
variants and how records name them, limits) and the checks that refuse anything else. The
runtime trusts nothing it reads from disk: every kernel, entry and module record is checked
here, and a malformed one is refused with a ValueError naming the record, never trusted at
launch.

artifact.py describes the format (the ctx layout and what each record key means) and holds the
classes built from checked records. The checks are apart because they read plain dicts and
need none of those classes: this module sits below artifact.py, which imports it.
"""
from __future__ import annotations

import re

from . import sizeexpr
from .print_buffer import check_message_record
from .spirv_args import GRID_TEMPS

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


def element_count(shape) -> int:
    count = 1
    for n in shape:
        count *= n
    return count


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
    """A struct layout (see artifact.py's docstring); the dtype of each of its scalars, in order.
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
    """CPU library record `i` (see artifact.py's docstring)."""
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
    """Bounds-check record `i` (see artifact.py's docstring): names a field shape or an ndarray
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
    """Task record `i` (see artifact.py's docstring): its entry symbol, trip count, launch policy
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
    """Stack record `i` of kernel meta dict `d` (see artifact.py's docstring), its SizeExpr tree
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
