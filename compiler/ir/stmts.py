"""The typed, structured IR.

A kernel is a `Block` of statements. Every statement that produces a value is that value
(SSA style): operands are references to earlier statements. Control flow is structured:
`If`, `RangeFor` and `While` own their blocks, which is what SPIR-V requires and what the
autodiff pass walks in reverse. Mutable locals live in `Alloca`s.

Each class declares which of its attributes are operands (`OPERANDS`), which are owned
blocks (`BLOCKS`) and which are plain attributes (`ATTRS`); passes, the printer, the verifier
and `clone` are written once against those three lists.
"""
from __future__ import annotations

from dataclasses import dataclass

from qdc.runtime.contract.types import DataType, u32 as _U32


@dataclass(frozen=True)
class SourceLoc:
    filename: str
    line: int
    col: int  # 1-based, as compilers print it

    def __str__(self) -> str:
        return f"{self.filename}:{self.line}:{self.col}"


class Block:
    __slots__ = ("stmts", "parent")

    def __init__(self, stmts=None, parent: Stmt | None = None):
        self.stmts: list[Stmt] = []
        self.parent = parent
        for s in stmts or ():
            self.append(s)

    def append(self, stmt: Stmt) -> Stmt:
        stmt.block = self
        self.stmts.append(stmt)
        return stmt

    def __iter__(self):
        return iter(self.stmts)

    def __len__(self):
        return len(self.stmts)


class Stmt:
    OPERANDS: tuple[str, ...] = ()
    BLOCKS: tuple[str, ...] = ()
    ATTRS: tuple[str, ...] = ()
    PURE = False  # no side effects, result depends only on operands and attrs: CSE/DCE may act

    def __init__(self, type: DataType | None = None, loc: SourceLoc | None = None):
        self.type = type
        self.loc = loc
        self.block: Block | None = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for method in ("operands", "replace_operands"):
            inherited = getattr(cls, method)
            if method not in cls.__dict__ and (inherited is getattr(Stmt, method) or hasattr(inherited, "OPERANDS")):
                setattr(cls, method, _specialised(method, cls.OPERANDS))

    # -- generic structure -------------------------------------------------------------
    # operands() and replace_operands() run millions of times on a large kernel (every pass of
    # every simplification round walks it): they are written for speed, and each statement
    # class gets its own copy with its OPERANDS spelt out (_specialised).
    def operands(self) -> list[Stmt]:
        out = []
        for name in self.OPERANDS:
            v = getattr(self, name)
            if v.__class__ is list:
                out += v
            elif v is not None:
                out.append(v)
        return out

    def replace_operands(self, mapping: dict) -> None:
        for name in self.OPERANDS:
            v = getattr(self, name)
            if v.__class__ is list:  # always a new list: clone_stmt relies on it not to share one
                setattr(self, name, [mapping.get(x, x) for x in v])
            elif v is not None and v in mapping:
                setattr(self, name, mapping[v])

    def blocks(self) -> list[Block]:
        if not self.BLOCKS:
            return []
        return [getattr(self, b) for b in self.BLOCKS]

    def attrs(self) -> tuple:
        return tuple(getattr(self, a) for a in self.ATTRS)

    @property
    def name(self) -> str:
        return type(self).__name__


_SPECIALISED_BODY = {
    "operands": ("    v = self.{0}\n"
                 "    if v.__class__ is list:\n"
                 "        out += v\n"
                 "    elif v is not None:\n"
                 "        out.append(v)\n"),
    "replace_operands": ("    v = self.{0}\n"
                         "    if v.__class__ is list:\n"
                         "        self.{0} = [mapping.get(x, x) for x in v]\n"
                         "    elif v is not None and v in mapping:\n"
                         "        self.{0} = mapping[v]\n"),
}


def _specialised(method: str, operands: tuple):
    """Stmt's generic `method` written out for the operand names `operands`, without the loop
    over the names and the getattr/setattr by name (as `dataclasses` writes its methods)."""
    head = "def operands(self):\n    out = []\n" if method == "operands" else "def replace_operands(self, mapping):\n"
    text = head + "".join(_SPECIALISED_BODY[method].format(n) for n in operands)
    text += "    return out\n" if method == "operands" else "    return None\n"
    namespace: dict = {}
    exec(compile(text, f"<Stmt.{method} of {', '.join(operands) or 'no operands'}>", "exec"), namespace)  # noqa: S102
    fn = namespace[method]
    fn.OPERANDS = operands  # marks it as made here: a subclass with other OPERANDS gets its own
    return fn


# ---- values ---------------------------------------------------------------------------

class Const(Stmt):
    ATTRS = ("value",)
    PURE = True

    def __init__(self, value, type: DataType, loc=None):
        super().__init__(type, loc)
        self.value = value


class ArgLoad(Stmt):
    """A scalar kernel argument."""
    ATTRS = ("arg_index",)
    PURE = True

    def __init__(self, arg_index: int, type: DataType, loc=None):
        super().__init__(type, loc)
        self.arg_index = arg_index


class NdarrayShape(Stmt):
    """`a.shape[dim]` of ndarray argument `arg_index`: i64 on targets whose arrays may pass 2**31
    elements, else i32 as in Quadrants (runtime/contract/extents.py)."""
    ATTRS = ("arg_index", "dim")
    PURE = True

    def __init__(self, arg_index: int, dim: int, type: DataType, loc=None):
        super().__init__(type, loc)
        self.arg_index, self.dim = arg_index, dim


UNARY_OPS = ("neg", "not", "bit_not", "abs", "sin", "cos", "tan", "asin", "acos", "atan",
             "tanh", "exp", "log", "sqrt", "rsqrt", "floor", "ceil", "round")
BINARY_OPS = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "min", "max",
              "bit_and", "bit_or", "bit_xor", "shl", "shr", "atan2",
              "lt", "le", "gt", "ge", "eq", "ne")
COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")


class Unary(Stmt):
    OPERANDS = ("x",)
    ATTRS = ("op",)
    PURE = True

    def __init__(self, op: str, x: Stmt, type: DataType, loc=None):
        assert op in UNARY_OPS, op
        super().__init__(type, loc)
        self.op, self.x = op, x


class Binary(Stmt):
    """Both operands have the same type; comparisons produce u1, the rest that type."""
    OPERANDS = ("a", "b")
    ATTRS = ("op",)
    PURE = True

    def __init__(self, op: str, a: Stmt, b: Stmt, type: DataType, loc=None):
        assert op in BINARY_OPS, op
        super().__init__(type, loc)
        self.op, self.a, self.b = op, a, b


class Cast(Stmt):
    OPERANDS = ("x",)
    PURE = True

    def __init__(self, x: Stmt, type: DataType, loc=None):
        super().__init__(type, loc)
        self.x = x


class Select(Stmt):
    OPERANDS = ("cond", "a", "b")
    PURE = True

    def __init__(self, cond: Stmt, a: Stmt, b: Stmt, loc=None):
        super().__init__(a.type, loc)
        self.cond, self.a, self.b = cond, a, b


class StopGrad(Stmt):
    """`qd.stop_grad(x)`: the value of `x`, through which no gradient flows (reverse or forward
    mode). Once the autodiff transforms have run, passes/intrinsics.py replaces it by `x`."""
    OPERANDS = ("x",)
    PURE = True

    def __init__(self, x: Stmt, loc=None):
        super().__init__(x.type, loc)
        self.x = x


class Random(Stmt):
    """`qd.random(type)`: a uniform draw, in [0, 1) for a float type and over every value for
    an integer type. Every execution draws anew, so it is not PURE (never merged, moved or
    recomputed); no gradient flows through it. passes/intrinsics.py expands it into integer
    arithmetic once the autodiff transforms have run."""

    def __init__(self, type: DataType, loc=None):
        super().__init__(type, loc)


RANDOM_STATE_WORDS = 4  # seed (low, high), launch counter (low, high)


class RandomState(Stmt):
    """u32 word `word` of the launch's random state, which the runtime writes before each
    launch of a kernel that draws (runtime/contract/artifact.py, `random_slot`): 0 and 1 the
    seed, 2 and 3 the count of earlier such launches, low word first."""
    ATTRS = ("word",)
    PURE = True

    def __init__(self, word: int, loc=None):
        super().__init__(_U32, loc)
        self.word = word


class DebugMessage(Stmt):
    """Append message `message` (its index in the kernel's `messages`, the artifact's message
    table) with `values` to the device's print buffer (runtime/contract/print_buffer.py): a
    `print` line, a failed assert or a debug check's report. Never moved or merged."""
    OPERANDS = ("values",)
    ATTRS = ("message",)

    def __init__(self, message: int, values: list, loc=None):
        super().__init__(None, loc)
        self.message, self.values = message, list(values)


# ---- locals -----------------------------------------------------------------------------

class Alloca(Stmt):
    """A mutable local variable of scalar type `type`, zero-initialised."""
    ATTRS = ("var_name",)

    def __init__(self, type: DataType, var_name: str = "", loc=None):
        super().__init__(type, loc)
        self.var_name = var_name


class LocalLoad(Stmt):
    OPERANDS = ("var",)

    def __init__(self, var: Alloca, loc=None):
        super().__init__(var.type, loc)
        self.var = var


class LocalStore(Stmt):
    OPERANDS = ("var", "value")

    def __init__(self, var: Alloca, value: Stmt, loc=None):
        super().__init__(None, loc)
        self.var, self.value = var, value


class LocalAccumulate(Stmt):
    """`var = op(var, value)` where the order of the updates does not matter: the
    thread-local half of a reduction (see passes/reductions.py). Backends may reassociate
    these updates (e.g. vectorise a float sum), which plain Binary arithmetic never allows."""
    OPERANDS = ("var", "value")
    ATTRS = ("op",)
    OPS = ("add", "mul", "min", "max", "and", "or", "xor")

    def __init__(self, op: str, var: Alloca, value: Stmt, loc=None):
        assert op in self.OPS, op
        super().__init__(None, loc)
        self.op, self.var, self.value = op, var, value


class LocalAtomic(Stmt):
    """`var = op(var, value)` as one indivisible update; the result is the old value. The front
    end emits it for `s += v` (and `qd.atomic_*(s, v)`) on a kernel-scope local `s` inside a
    top-level parallel loop: every iteration updates the same variable, which offloading turns
    into a kernel temporary and this into a `TempAtomic`. Before that, single-thread semantics."""
    OPERANDS = ("var", "value")
    ATTRS = ("op",)

    def __init__(self, op: str, var: Alloca, value: Stmt, loc=None):
        assert op in ATOMIC_OPS, op
        super().__init__(var.type, loc)
        self.op, self.var, self.value = op, var, value


# ---- globals ----------------------------------------------------------------------------

class FieldRef:
    """A field the kernel touches; `slot` indexes the kernel's field table."""
    __slots__ = ("slot", "name", "dtype", "shape", "is_grad")

    def __init__(self, slot: int, name: str, dtype: DataType, shape: tuple, is_grad: bool):
        self.slot, self.name, self.dtype, self.shape, self.is_grad = slot, name, dtype, shape, is_grad

    def __repr__(self):  # a companion's name says what it is: "x.grad", "x.dual"
        return f"@{self.name}"


class NdarrayRef:
    """Ndarray argument `arg_index` (or its gradient buffer)."""
    __slots__ = ("arg_index", "name", "dtype", "ndim", "is_grad")

    def __init__(self, arg_index: int, name: str, dtype: DataType, ndim: int, is_grad: bool):
        self.arg_index, self.name, self.dtype, self.ndim, self.is_grad = arg_index, name, dtype, ndim, is_grad

    def __repr__(self):
        return f"%arg{self.arg_index}:{self.name}" + (".grad" if self.is_grad else "")


class SharedRef:
    """A block-shared array (`qd.simt.block.SharedArray(shape, dtype)`): one copy per block of
    threads, as long as the task runs; its element type and shape are static. The front end
    makes one per declaration (`uid` numbers them in the kernel), addressed by `GlobalPtr`."""
    __slots__ = ("uid", "name", "dtype", "shape")
    is_grad = False

    def __init__(self, uid: int, name: str, dtype: DataType, shape: tuple):
        self.uid, self.name, self.dtype, self.shape = uid, name, dtype, tuple(shape)

    def __repr__(self):
        return f"$shared{self.uid}:{self.name}"


class GlobalPtr(Stmt):
    """Address of element `indices` of a field or ndarray; `type` is the element type."""
    OPERANDS = ("indices",)
    ATTRS = ("target",)
    PURE = True

    def __init__(self, target: FieldRef | NdarrayRef, indices: list[Stmt], loc=None):
        super().__init__(target.dtype, loc)
        self.target, self.indices = target, list(indices)


class GlobalLoad(Stmt):
    OPERANDS = ("ptr",)

    def __init__(self, ptr: GlobalPtr, loc=None):
        super().__init__(ptr.type, loc)
        self.ptr = ptr
        # Where a later write of the same kernel may overwrite what this reads (set by autodiff's
        # checks): a gradient kernel, which runs after the kernel, cannot read it again.
        self.clobbered_by: SourceLoc | None = None


class GlobalStore(Stmt):
    OPERANDS = ("ptr", "value")

    def __init__(self, ptr: GlobalPtr, value: Stmt, loc=None):
        super().__init__(None, loc)
        self.ptr, self.value = ptr, value


ATOMIC_OPS = ("add", "sub", "mul", "min", "max", "and", "or", "xor", "xchg")  # xchg: stores the value


class AtomicRMW(Stmt):
    """Atomically `*ptr = op(*ptr, value)`; the result is the old value."""
    OPERANDS = ("ptr", "value")
    ATTRS = ("op",)

    def __init__(self, op: str, ptr: GlobalPtr, value: Stmt, loc=None):
        assert op in ATOMIC_OPS, op
        super().__init__(ptr.type, loc)
        self.op, self.ptr, self.value = op, ptr, value
        self.clobbered_by: SourceLoc | None = None  # a min/max whose final value a later write changes (GlobalLoad's)


class TempLoad(Stmt):
    """Read a kernel-scoped temporary: how values cross from one offloaded task to the next."""
    ATTRS = ("slot",)

    def __init__(self, slot: int, type: DataType, loc=None):
        super().__init__(type, loc)
        self.slot = slot


class TempStore(Stmt):
    OPERANDS = ("value",)
    ATTRS = ("slot",)

    def __init__(self, slot: int, value: Stmt, loc=None):
        super().__init__(None, loc)
        self.slot, self.value = slot, value


class TempAtomic(Stmt):
    """Atomically `t[slot] = op(t[slot], value)`; the result is the old value (a `LocalAtomic`
    on a local that offloading made a kernel temporary)."""
    OPERANDS = ("value",)
    ATTRS = ("op", "slot")

    def __init__(self, op: str, slot: int, value: Stmt, loc=None):
        assert op in ATOMIC_OPS, op
        super().__init__(value.type, loc)
        self.op, self.slot, self.value = op, slot, value


# ---- control flow -----------------------------------------------------------------------

class If(Stmt):
    OPERANDS = ("cond",)
    BLOCKS = ("then_block", "else_block")

    def __init__(self, cond: Stmt, loc=None):
        super().__init__(None, loc)
        self.cond = cond
        self.then_block = Block(parent=self)
        self.else_block = Block(parent=self)


class LoopIndex(Stmt):
    """The induction variable of `loop`; defined by the loop, usable inside its body."""
    PURE = True

    def __init__(self, loop: RangeFor, type: DataType):
        super().__init__(type, loop.loc)
        self.loop = loop


class RangeFor(Stmt):
    """`for index in [begin, end)`, step 1. At the top level of a kernel it is a parallel task
    unless `serial`; nested inside a task it runs serially. `kind` records the source form
    ("range", "ndrange" or "struct") for task metadata; `ndim` how many dimensions the front
    end flattened into the index (the body decomposes it, row-major)."""
    OPERANDS = ("begin", "end")
    BLOCKS = ("body",)
    ATTRS = ("serial", "kind", "ndim", "block_dim", "max_threads", "label")

    def __init__(self, begin: Stmt, end: Stmt, index_type: DataType, serial=False, kind="range", loc=None,
                 ndim: int = 1, block_dim: int | None = None):
        super().__init__(None, loc)
        self.begin, self.end = begin, end
        self.serial, self.kind, self.ndim = serial, kind, ndim
        self.block_dim = block_dim  # qd.loop_config(block_dim=...): threads per block on GPU targets
        self.max_threads: int | None = None  # qd.loop_config(parallelize=N): at most N CPU threads
        self.label: str | None = None  # qd.loop_config(name=...): names the loop's task
        self.body = Block(parent=self)
        self.index = LoopIndex(self, index_type)


class While(Stmt):
    """Loops until a `Break`; `while cond:` is a `While` whose body starts with `if not cond: break`."""
    BLOCKS = ("body",)

    def __init__(self, loc=None):
        super().__init__(None, loc)
        self.body = Block(parent=self)


class GraphDoWhile(While):
    """`while qd.graph.do_while(flag):` at a kernel's top level (or in another one's body): the
    body runs, then again while 0-d i32 ndarray argument `flag` is nonzero. Until offloading it
    is a loop to every pass; offloading flattens it into the tasks of its body, each recording
    the loops around it (`Task.graph_loops`), and the runtime replays them."""
    ATTRS = ("flag",)

    def __init__(self, flag: int, loc=None):
        super().__init__(loc)
        self.flag = flag


class Break(Stmt):
    pass


class Continue(Stmt):
    pass


# ---- offloaded form ---------------------------------------------------------------------

class Task(Stmt):
    """One unit of launch after offloading. `kind` is "serial" (body runs once) or
    "range_for" (body runs for every index in [begin, end), in parallel unless `serial`).
    `prologue` computes `begin`/`end` once per launch, before any iteration.

    A range-for task is run as chunks of its range (one per worker thread on the CPU).
    `chunk_init` runs once at the start of every chunk and `chunk_final` once at its end
    (only when the chunk is not empty); values of `chunk_init` are visible in `body` and
    `chunk_final`. Thread-local reductions live there: the accumulator and its one atomic.

    Row structure (passes/task_axes.py): when `axes` holds the extents E1..En-1 (values of
    `chunk_init`), `axis_index[d]` is coordinate d of `index` in the row-major grid
    (unbounded, E1, ..., En-1), so a backend may walk each chunk as rows instead of dividing
    every index. Every extent is >= 1 whenever the range is non-empty (the range is their
    product); `index` stays usable beside the coordinates."""
    BLOCKS = ("prologue", "chunk_init", "body", "chunk_final")
    ATTRS = ("kind", "serial", "source_kind", "task_name", "ndim", "block_dim", "max_threads")

    def __init__(self, kind: str, loc=None):
        super().__init__(None, loc)
        self.kind = kind
        self.serial = kind == "serial"
        self.source_kind = kind
        self.task_name = ""
        self.prologue = Block(parent=self)
        self.chunk_init = Block(parent=self)
        self.body = Block(parent=self)
        self.chunk_final = Block(parent=self)
        self.begin: Stmt | None = None
        self.end: Stmt | None = None
        self.index: LoopIndex | None = None
        self.ndim = 1
        self.block_dim: int | None = None  # from the loop's qd.loop_config; None: the target's default
        self.max_threads: int | None = None  # qd.loop_config(parallelize=N) of the loop: at most N CPU threads
        self.label: str | None = None  # qd.loop_config(name=...) of the loop: part of task_name
        # The qd.graph.do_while loops around the task, outermost first (KernelIR.graph_loops ids)
        self.graph_loops: tuple = ()
        self.axes: list[Stmt] = []
        self.axis_index: list[LoopIndex] = []

    def operands(self):  # begin/end live in the prologue; the verifier checks they do
        return []


# ---- kernel -----------------------------------------------------------------------------

class Param:
    """A kernel parameter: kind "scalar" or "ndarray". An ndarray of vectors/matrices has its
    `element_shape` as trailing axes, counted in `ndim` (the scalar array's rank)."""
    __slots__ = ("name", "kind", "dtype", "ndim", "needs_grad", "element_shape", "layout")

    def __init__(self, name, kind, dtype, ndim=0, needs_grad=False, element_shape=(), layout=None):
        """`layout` (ndarrays): the order the array's own axes are stored in (None: as indexed)."""
        self.name, self.kind, self.dtype, self.ndim, self.needs_grad = name, kind, dtype, ndim, needs_grad
        self.element_shape = tuple(element_shape)
        self.layout = None if layout is None else tuple(layout)

    def __repr__(self):
        if self.kind == "scalar":
            return f"{self.name}: {self.dtype}"
        return f"{self.name}: ndarray({self.dtype}, ndim={self.ndim}{', needs_grad' if self.needs_grad else ''})"


class KernelIR:
    """A kernel being compiled: parameters, the fields it touches, its body, and after
    offloading its tasks (the body then holds only `Task`s)."""

    def __init__(self, name: str, params: list[Param], loc: SourceLoc | None = None):
        self.name = name
        self.params = params
        self.fields: list[FieldRef] = []
        self.body = Block()
        self.loc = loc
        self.num_temps = 0
        self.temp_types: list[DataType] = []
        # What the kernel returns: the artifact's "returns" record (frontend/returns.py), whose
        # "slots" are temporaries read after the launch; None when it returns nothing.
        self.returns: dict | None = None
        # The print, assert and debug-check messages that DebugMessage statements name: the
        # artifact's `messages` records (runtime/contract/print_buffer.py).
        self.messages: list = []
        # The flag argument of each qd.graph.do_while loop, by loop id (Task.graph_loops)
        self.graph_loops: list = []
        # Parameters read off a dataclass or template argument at launch (frontend/host_objects.py):
        # parameter name -> the path to it, [argument, attribute or index, ...]
        self.members: dict = {}
        # The kernel's arguments in call order (its template ones aside): what a launch that reads
        # members takes (None: one argument per parameter)
        self.signature: list | None = None
        # Lanes per subgroup on the target compiled for (qd.simt.subgroup.group_size())
        self.subgroup_size = 32


    @property
    def symbol(self) -> str:
        """The name as native symbols spell it: Python allows non-ASCII identifiers, PTX and ELF
        tools do not, so each non-ASCII character becomes `_u<hex>_`."""
        return "".join(c if c.isascii() else f"_u{ord(c):x}_" for c in self.name)
    def field_ref(self, field, is_grad: bool) -> FieldRef:
        """The kernel's reference to `field` (a runtime Field object), allocated on first use."""
        for ref in self.fields:
            if ref.name == field.name and ref.is_grad == is_grad:
                return ref
        ref = FieldRef(len(self.fields), field.name, field.dtype, tuple(field.storage_shape), is_grad)
        self.fields.append(ref)
        return ref

    @property
    def tasks(self) -> list[Task]:
        return [s for s in self.body if isinstance(s, Task)]


# ---- traversal helpers ------------------------------------------------------------------

def walk(block: Block):
    """Every statement in `block`, nested blocks included, in program order (pre-order). An
    explicit stack: nested generators would pass each statement up through one frame per level
    of nesting, which large kernels (hundreds of nested branches) pay for on every walk."""
    stack = [iter(block.stmts)]
    while stack:
        s = next(stack[-1], None)
        if s is None:
            stack.pop()
            continue
        yield s
        if s.BLOCKS:
            stack.extend(iter(b.stmts) for b in reversed(s.blocks()))


def walk_nested(stmt: Stmt):
    """Every statement inside `stmt`'s blocks (not `stmt` itself)."""
    for b in stmt.blocks():
        yield from walk(b)


def users_count(block: Block) -> dict:
    counts: dict = {}
    for s in walk(block):
        for o in s.operands():
            counts[o] = counts.get(o, 0) + 1
        if isinstance(s, Task):
            for o in task_bounds(s):
                counts[o] = counts.get(o, 0) + 1
    return counts


def task_bounds(task: Task) -> list:
    """A task's bounds and axes: uses of values that are no operands of the task (they live in
    its blocks), which only the top level's tasks have."""
    return [o for o in (task.begin, task.end, *task.axes) if o is not None]


def _map_task_bounds(task: Task, mapping: dict) -> None:
    task.begin = mapping.get(task.begin, task.begin)
    task.end = mapping.get(task.end, task.end)
    task.axes = [mapping.get(a, a) for a in task.axes]


def replace_uses(block: Block, mapping: dict) -> None:
    """Make every use of a key of `mapping` inside `block` (task bounds included) use its value."""
    if not mapping:
        return
    for s in walk(block):
        s.replace_operands(mapping)
        if isinstance(s, Task):
            _map_task_bounds(s, mapping)


def class_kind(cls: type, classes: tuple, cache: dict) -> int:
    """The index in `classes` of the first class (or tuple of classes) that `cls` derives from,
    len(classes) if none, remembered in `cache`: passes that treat each statement by its class
    look it up once per class instead of testing every statement against each class."""
    kind = cache[cls] = next((i for i, c in enumerate(classes) if issubclass(cls, c)), len(classes))
    return kind


def replace_in_task_bounds(block: Block, mapping: dict) -> None:
    """What remains of `replace_uses(block, mapping)` after a pass that replaced operands as it
    walked the statements in program order, each one before any statement maps (the verifier's
    scoping rule: operands are defined earlier, so every key of `mapping` was added before its
    uses were reached): the tasks' bounds and axes (`task_bounds`). Spares passes a second
    walk over every statement of a large kernel."""
    if not mapping:
        return
    for s in block.stmts:
        if isinstance(s, Task):
            _map_task_bounds(s, mapping)


def clone_block(src: Block, dst: Block, mapping: dict) -> None:
    """Append deep copies of `src`'s statements to `dst`; `mapping` maps old→new statements
    (pre-seed it to substitute operands) and is extended as statements are copied."""
    for s in src.stmts:
        dst.append(clone_stmt(s, mapping))


def clone_stmt(s: Stmt, mapping: dict) -> Stmt:
    new = object.__new__(type(s))
    new.__dict__.update(s.__dict__)
    new.block = None
    mapping[s] = new
    for bname in s.BLOCKS:
        nb = Block(parent=new)
        setattr(new, bname, nb)
    if isinstance(s, RangeFor):
        new.index = LoopIndex(new, s.index.type)
        mapping[s.index] = new.index
    if isinstance(s, Task):
        if s.index is not None:
            new.index = LoopIndex(new, s.index.type)
            mapping[s.index] = new.index
        new.axis_index = [LoopIndex(new, a.type) for a in s.axis_index]
        mapping.update(zip(s.axis_index, new.axis_index))
    for bname in s.BLOCKS:
        clone_block(getattr(s, bname), getattr(new, bname), mapping)
    new.replace_operands(mapping)
    if isinstance(s, Task):
        new.begin = mapping.get(s.begin, s.begin)
        new.end = mapping.get(s.end, s.end)
        new.axes = [mapping.get(a, a) for a in s.axes]
    return new
