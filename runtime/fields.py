"""Fields (global, module-level arrays) and ndarrays (device arrays passed as arguments).

Both are backed by a device `Allocation` of the active runtime, made on first use and remade
(zeroed) after `qd.init`, so they may be declared before `qd.init`. Host access goes through
the allocation's host view when the device shares memory with the host (CPU), else through
explicit copies. Host-side indexing follows numpy for integer indices (negative ones count
from the end); values are converted to the element type as numpy assignment does.
"""
from __future__ import annotations

import itertools
import weakref

import numpy as np

from . import context
from . import element_proxy, lifecycle
from .contract.objects import FieldMarker, NdarrayMarker, StructFieldMarker
from .contract.tensor_api import Layout, check_layout
from .contract.python_scope import device_arrays, scope_types
from .contract.types import DataType, from_numpy as dtype_from_numpy

_ids = itertools.count()
DUAL_FIELDS: "weakref.WeakSet[Field]" = weakref.WeakSet()  # what a FwdMode clears on entry, as Quadrants does


def _normalise_shape(shape) -> tuple:
    """`shape` as a tuple of Python ints: an integer (Python or numpy), or a sequence of them
    (a tuple, list or 1-d integer array); anything else, or a negative size, is a ValueError."""
    if shape is None:
        return ()
    if isinstance(shape, np.ndarray) and shape.ndim == 0:
        shape = shape.item()
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise ValueError(f"shape must be an integer or a tuple of integers, got {shape!r}") from None
    out = tuple(_dimension(d, shape) for d in dims)
    if any(d < 0 for d in out):
        raise ValueError(f"shape {out} has a negative dimension")
    return out


def _dimension(d, shape) -> int:
    if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
        raise ValueError(f"shape must be an integer or a tuple of integers, got {shape!r} "
                         f"(the size {d!r} is not an integer)")
    return int(d)


class ElementType:
    """A vector/matrix element type as the runtime sees it: a scalar type and the element's
    shape, stored as trailing axes (a field of `qd.math.vec3` is an f32 array of shape (..., 3)).
    The compiler's `MatrixType` (compiler/language/matrix.py) has the same two attributes."""

    def __init__(self, scalar_dtype: DataType, element_shape: tuple):
        self.scalar_dtype, self.element_shape = scalar_dtype, tuple(element_shape)


def _element_type(dtype) -> tuple:
    """(scalar type, element shape) of a field/ndarray dtype: () for a scalar type."""
    shape = getattr(dtype, "element_shape", None)
    if shape is not None and not isinstance(dtype, DataType):
        return _data_type(dtype.scalar_dtype), tuple(int(s) for s in shape)
    return _data_type(dtype), ()


def _data_type(dtype) -> DataType:
    if isinstance(dtype, DataType):
        return dtype
    if dtype is int or dtype is float:
        # default_ip / default_fp, as in Quadrants (numpy's float64 stays f64): Python scope's
        # (contract/python_scope.py: a `qdc build`'s while it imports its modules, else qd.init's;
        # Quadrants' defaults in a deployment)
        default_ip, default_fp = scope_types.current()
        return default_ip if dtype is int else default_fp
    try:
        dt = dtype_from_numpy(dtype)
    except TypeError:
        dt = None
    if dt is None:
        raise TypeError(f"unsupported dtype {dtype!r} (use qd.f32, qd.i32, ... or the matching numpy dtype)")
    return dt


class _DeviceArray:
    """Shared host-side API of fields and ndarrays."""

    def __init__(self, dtype, shape, layout=None):
        self._dtype, self._element_shape = _element_type(dtype)
        self._shape = _normalise_shape(shape)
        self._layout = check_layout(layout, len(self._shape))
        self._alloc = None
        self._gen = 0
        self._view = None

    @property
    def dtype(self) -> DataType:
        return self._dtype

    @property
    def shape(self) -> tuple:
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def element_shape(self) -> tuple:
        """The shape of one element: () for scalars, (n,) for vectors, (n, m) for matrices."""
        return self._element_shape

    @property
    def storage_shape(self) -> tuple:
        """`shape` (its axes in storage order, `layout`) followed by `element_shape`: the shape of
        the scalar array in memory; kernels index it with the element's components as trailing
        indices."""
        if self._layout is None:
            return self._shape + self._element_shape
        return tuple(self._shape[a] for a in self._layout) + self._element_shape

    @property
    def layout(self):
        """The order the axes are stored in, outermost first (qd.tensor's `layout=`), or None:
        as declared. Kernels and Python scope index the array in its declared (canonical) order."""
        return self._layout

    def _canonical(self, stored: np.ndarray) -> np.ndarray:
        """An array in storage order seen in the declared order of the axes (a view)."""
        if self._layout is None:
            return stored
        inverse = [self._layout.index(a) for a in range(len(self._shape))]
        return stored.transpose(inverse + list(range(len(self._shape), stored.ndim)))

    def _stored(self, canonical: np.ndarray) -> np.ndarray:
        """The inverse of `_canonical`."""
        if self._layout is None:
            return canonical
        return canonical.transpose(list(self._layout) + list(range(len(self._shape), canonical.ndim)))

    def _element_spec(self):
        """What a buffer of the same elements (a .grad, a .dual) is declared with."""
        return ElementType(self._dtype, self._element_shape) if self._element_shape else self._dtype

    @property
    def size(self) -> int:
        return int(np.prod(self._shape, dtype=np.int64)) if self._shape else 1

    @property
    def nbytes(self) -> int:
        return self.size * int(np.prod(self._element_shape, dtype=np.int64)) * self._dtype.nbytes

    @property
    def n(self) -> int:
        """A vector element's length, a matrix element's rows."""
        if not self._element_shape:
            raise AttributeError(f"{self._what()} holds scalars: it has no .n")
        return self._element_shape[0]

    @property
    def m(self) -> int:
        """A matrix element's columns (1 for a vector)."""
        if not self._element_shape:
            raise AttributeError(f"{self._what()} holds scalars: it has no .m")
        return self._element_shape[1] if len(self._element_shape) == 2 else 1

    def _unwrap(self):
        """Quadrants' `qd.Tensor._unwrap()`: a qdc array is its own implementation."""
        return self

    def has_grad(self) -> bool:
        return self.grad is not None

    def has_dual(self) -> bool:
        return self.dual is not None

    def __deepcopy__(self, memo):
        """A new array of the same kind with a copy of the contents (and of .grad and .dual):
        copied on the device where it can copy between buffers, else through the host."""
        copy = self._empty_like()
        memo[id(self)] = copy
        for src, dst in ((self, copy), (self.grad, copy.grad), (self.dual, copy.dual)):
            if src is not None:
                src._copy_onto(dst)
        return copy

    def _copy_onto(self, other: "_DeviceArray") -> None:
        context.current().device.copy_between(self.allocation(), other.allocation(), self.nbytes)

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError(f"len() of 0-d {self._what()}")
        return self._shape[0]

    def allocation(self):
        """This array's memory on the active runtime (allocated, zeroed, on first use); a
        DeviceLostError while that runtime's device is lost."""
        if lifecycle._pending:  # a Python-scope access after new fields were declared
            lifecycle.materialize_pending()
        rt = context.current()
        if rt.device.lost is not None:
            rt.device.check_not_lost()
        if self._gen != rt.generation:
            self._alloc = rt.device.allocate(self.nbytes)
            self._gen = rt.generation
            host = self._alloc.host
            self._view = None if host is None else host.view(self._dtype.np_dtype).reshape(self.storage_shape)
        return self._alloc

    def _host_view(self):
        """The host view of the current allocation (no sync), or None for device memory."""
        self.allocation()
        return self._view

    def _synced_view(self):
        """The host view after pending device work completed, or None for device memory."""
        view = self._host_view()
        context.current().device.sync()
        return view

    def to_numpy(self, dtype=None, keep_dims: bool = False, *, copy: bool | None = True) -> np.ndarray:
        """A copy of the contents (converted to `dtype` if given). `keep_dims=True` gives a
        vector element the shape (n, 1), as Quadrants does. `copy`, as in Quadrants: True an
        independent copy; None a copy (zero-copy is optional there); False the field's own host
        memory, written through by later launches, or a ValueError where there is none to give
        (device memory, a layout, a dtype conversion, keep_dims)."""
        if copy is False:
            return self._zero_copy_numpy(dtype, keep_dims)
        if copy is not True and copy is not None:
            raise TypeError(f"field '{self.name}': to_numpy(copy=...) takes True, False or None, got {copy!r}")
        out = self._copy_to_numpy(dtype)
        if self._layout is not None:
            out = np.ascontiguousarray(self._canonical(out))
        if keep_dims and len(self._element_shape) == 1:
            return out.reshape(self._shape + self._element_shape + (1,))
        return out

    def _zero_copy_numpy(self, dtype, keep_dims: bool) -> np.ndarray:
        view = self._synced_view()
        why = ("its memory is on the device" if view is None else
               "it has a layout" if self._layout is not None else
               f"it needs a conversion from {self._dtype.np_dtype} to {np.dtype(dtype)}"
               if dtype is not None and np.dtype(dtype) != self._dtype.np_dtype else
               "keep_dims=True reshapes it" if keep_dims and len(self._element_shape) == 1 else None)
        if why is not None:
            raise ValueError(f"field '{self.name}': to_numpy(copy=False) needs a zero-copy view, but {why}")
        return view

    def _copy_to_numpy(self, dtype) -> np.ndarray:
        view = self._synced_view()
        if view is not None:
            out = view.copy()
        else:
            out = np.empty(self.storage_shape, self._dtype.np_dtype)
            context.current().device.copy_to_host(self.allocation(), out)
        return out if dtype is None else out.astype(dtype)

    def from_numpy(self, arr) -> None:
        """Overwrite the contents with `arr` (same shape; converted within its kind)."""
        arr = np.asarray(arr)
        canonical = self._shape + self._element_shape
        if len(self._element_shape) == 1 and arr.shape in (canonical + (1,),  # a column or row vector
                                                           canonical[:-1] + (1,) + canonical[-1:]):
            arr = arr.reshape(canonical)  # each element a column or row, as in Quadrants
        if arr.shape != canonical:
            raise ValueError(f"{self._what()}: from_numpy got an array of shape {arr.shape}, "
                             f"expected {canonical}")
        arr = self._stored(arr)
        want = self._dtype.np_dtype
        if arr.dtype != want and not np.can_cast(arr.dtype, want, "same_kind"):
            raise TypeError(f"{self._what()} holds {self._dtype}: from_numpy cannot convert {arr.dtype} "
                            f"data without changing its kind; convert it first (arr.astype(np.{want}))")
        view = self._synced_view()
        if view is not None:
            np.copyto(view, arr, casting="same_kind")
        else:
            context.current().device.copy_to_device(self.allocation(), np.ascontiguousarray(arr, want))

    def to_torch(self, device=None, copy=True):
        """A copy of the contents as a torch tensor on `device` (default the CPU), as Quadrants';
        `copy=False`: a tensor over this array's own memory (runtime/torch_conversions.py)."""
        from .torch_conversions import to_torch
        return to_torch(self, device, copy)

    def from_torch(self, arr) -> None:
        """Overwrite the contents with a torch tensor's (same shape), as from_numpy does."""
        from .torch_conversions import from_torch
        from_torch(self, arr)

    def fill(self, val) -> None:
        """Set every element to `val`: on a device without host memory, a fill on the device
        ordered with the launches before and after it (no wait)."""
        element = self._element(val)
        view = self._host_view()
        if view is None:
            context.current().device.fill(self.allocation(), 0, self.nbytes, element.tobytes())
            return
        context.current().device.sync()
        view[...] = element

    def _element(self, value):
        """`value` as this array's element type (as numpy assignment converts it: floats into
        an integer type truncate, integers out of its range are an error)."""
        try:
            element = np.array(value, dtype=self._dtype.np_dtype)
            if element.shape != self._element_shape:  # a scalar fills a vector element
                element = np.broadcast_to(element, self._element_shape).copy()
            return element
        except OverflowError:
            raise ValueError(f"{self._what()}: {value!r} is out of range for {self._dtype}"[:300]) from None
        except (TypeError, ValueError):
            raise TypeError(f"{self._what()}: cannot store {value!r} in a {self._dtype} element"[:300]) from None

    def _index(self, key) -> tuple:
        if key is None:
            key = ()
        elif not isinstance(key, tuple):
            key = (key,)
        if len(key) != len(self._shape):
            hint = " (use x[None] for a 0-d field)" if not self._shape else ""
            raise IndexError(f"{self._what()} has {len(self._shape)} dimension(s), "
                             f"indexed with {len(key)}{hint}")
        for k, n in zip(key, self._shape):
            if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
                raise TypeError(f"{self._what()}: index {k!r} is not an integer "
                                f"(for slices, use to_numpy() / from_numpy())")
            if not -n <= k < n:
                raise IndexError(f"{self._what()}: index {k} is out of range for a dimension of size {n}")
        return key

    def _stored_index(self, key: tuple) -> tuple:
        """A checked index in the declared order of the axes, in their storage order."""
        return key if self._layout is None else tuple(key[a] for a in self._layout)

    def __getitem__(self, key):
        key = self._index(key)
        return self._read_element(self._stored_index(key), key)

    def __setitem__(self, key, value):
        key = self._stored_index(self._index(key))
        element = self._element(value)
        view = self._host_view()
        if view is not None:
            context.current().device.sync()
            view[key] = element
        else:  # a ranged write of that one element, ordered with the launches around it (no wait)
            context.current().device.copy_to_device(self.allocation(), element.reshape(-1), self._byte_offset(key))

    def _byte_offset(self, idx: tuple) -> int:
        """Where element `idx` (in range; negative indices count from the end) starts."""
        flat = 0
        for i, n in zip(idx, self.storage_shape):
            flat = flat * n + (i + n if i < 0 else i)
        return flat * self._element_count() * self._dtype.np_dtype.itemsize

    def _element_count(self) -> int:
        return int(np.prod(self._element_shape, dtype=np.int64))

    def _read_element(self, idx: tuple, key: tuple | None = None):
        """Element `idx` (checked by the caller) as a Python scalar, or a vector/matrix element as
        a qd.Matrix that writes item assignments back (runtime/element_proxy.py): read through the host view
        where the device shares memory, else a ranged read of that element alone (never a
        copy of the whole array)."""
        key = idx if key is None else key  # the element proxy stores back through __setitem__
        view = self._synced_view()
        if view is not None:
            if not self._element_shape:
                return view[idx].item()
            return element_proxy.element(view[idx].copy(), self, key)
        out = np.empty(self._element_count(), self._dtype.np_dtype)
        context.current().device.copy_to_host(self.allocation(), out, self._byte_offset(idx))
        if not self._element_shape:
            return out[0].item()
        return element_proxy.element(out.reshape(self._element_shape), self, key)

    def _what(self) -> str:
        return type(self).__name__.lower()


class Field(_DeviceArray, FieldMarker):
    """`qd.field(dtype, shape=(), needs_grad=False, name=None, needs_dual=False)`: a dense global array."""

    def __init__(self, dtype, shape=(), needs_grad=False, name=None, _is_grad=False, needs_dual=False, layout=None):
        super().__init__(dtype, shape, layout)
        lifecycle.fields_created()
        self.id = next(_ids)
        self.name = name or f"field{self.id}"
        self.is_grad = _is_grad
        self.needs_grad = bool(needs_grad)
        self.grad = Field(self._element_spec(), self._shape, name=self.name + ".grad", _is_grad=True,
                          layout=self._layout) if needs_grad else None
        # Forward mode's tangents (runtime/forward_mode.py); a dual is a buffer of its field, as a .grad is
        self.needs_dual = bool(needs_dual)
        self.dual = Field(self._element_spec(), self._shape, name=self.name + ".dual", _is_grad=True,
                          layout=self._layout) if needs_dual else None
        if needs_dual:
            DUAL_FIELDS.add(self)

    def set_name(self, name: str) -> None:
        self.name = name
        if self.grad is not None:
            self.grad.name = name + ".grad"
        if self.dual is not None:
            self.dual.name = name + ".dual"

    def _what(self):
        return f"field '{self.name}'"

    def _empty_like(self) -> "Field":
        return Field(self._element_spec(), self._shape, self.needs_grad, self.name, needs_dual=self.needs_dual,
                     layout=self._layout)

    def __repr__(self):
        return f"<qdc field {self.name}: {self._dtype}{list(self._shape)}>"


class Ndarray(_DeviceArray, NdarrayMarker):
    """`qd.ndarray(dtype, shape, needs_grad=False, needs_dual=False)`: a device-resident array passed to kernels."""

    def __init__(self, dtype, shape, needs_grad=False, needs_dual=False, layout=None):
        super().__init__(dtype, shape, layout)
        self.needs_grad = bool(needs_grad)
        self.grad = Ndarray(self._element_spec(), self._shape, layout=self._layout) if needs_grad else None
        self.needs_dual = bool(needs_dual)
        self.dual = Ndarray(self._element_spec(), self._shape, layout=self._layout) if needs_dual else None

    def _what(self):
        return f"qd.ndarray {self._dtype}{list(self._shape)}"

    def _empty_like(self) -> "Ndarray":
        return Ndarray(self._element_spec(), self._shape, self.needs_grad, self.needs_dual, self._layout)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule over this array's memory (no copy): torch.from_dlpack(a), np.from_dlpack(a)."""
        from .dlpack_capsule import export
        return export(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self) -> tuple:
        from .dlpack_capsule import dlpack_device
        return dlpack_device(self)

    def __repr__(self):
        return f"<qdc ndarray {self._dtype}{list(self._shape)}>"


def field(dtype, shape=(), needs_grad=False, name=None, needs_dual=False, layout=None, *, order=None,
          offset=None) -> Field:
    """Quadrants' `order` and `offset` by keyword (field_axes_order tells them); the positions
    are qdc's documented ones (needs_grad third). `layout`: the storage order of the axes (a
    permutation), or qd.Layout.AOS/SOA (a storage hint, runtime/tensors.py)."""
    layout = field_axes_order("qd.field", shape, order, offset, layout)
    return Field(dtype, shape, needs_grad, name, needs_dual=needs_dual, layout=layout)


_AXIS_LETTERS = "ijklmnop"


def field_axes_order(what: str, shape, order, offset, layout):
    """The storage order of a field's axes (outermost first; None: as declared) from Quadrants'
    `order`, the axes' letters in storage order ("ji": j outermost, as Quadrants names them), or
    qdc's `layout`. Quadrants' `offset` shifts the indices a field accepts; qdc fields are
    indexed from 0, so only a zero offset is accepted."""
    if offset is not None and any(int(o) != 0 for o in np.atleast_1d(offset)):
        raise NotImplementedError(f"{what}(offset={offset!r}): qdc fields are indexed from 0; "
                                  f"index with the offset subtracted instead")
    axes = _axes_order(layout)
    if order is None:
        return axes
    if axes is not None:
        raise ValueError(f"{what}() takes order= or an axes layout=, not both")
    letters = _AXIS_LETTERS[:len(shape) if isinstance(shape, (tuple, list)) else 1]
    if not isinstance(order, str) or sorted(order) != sorted(letters):
        raise ValueError(f"{what}(order={order!r}) must name the axes {letters!r} in storage order")
    perm = tuple(letters.index(c) for c in order)
    return None if perm == tuple(range(len(letters))) else perm


def ndarray(dtype, shape, needs_grad=False, needs_dual=False, layout=None) -> Ndarray:
    return Ndarray(dtype, shape, needs_grad, needs_dual, _axes_order(layout))


def _axes_order(layout):
    return None if isinstance(layout, Layout) else layout


def _is_struct_type(dtype) -> bool:
    return isinstance(getattr(dtype, "members", None), dict)


class StructField(StructFieldMarker):
    """A field of structs: one field per member (struct-of-arrays), a nested struct being a
    struct field itself. `struct_type` has `members` (name -> qd scalar type, vector/matrix type
    or struct type). Members are named `<name>__<member>` so that every one of them is a plain
    field of a module built ahead of time; `p.a` is member `a`'s field in Python scope."""

    def __init__(self, struct_type, shape=(), needs_grad=False, name=None, _is_grad=False, needs_dual=False):
        self.struct_type = struct_type
        self.shape = _normalise_shape(shape)
        self.is_grad, self.needs_grad = _is_grad, bool(needs_grad)
        self.name = name or f"struct{next(_ids)}"
        self.members = {}
        for member, dtype in struct_type.members.items():
            make = StructField if _is_struct_type(dtype) else Field
            self.members[member] = make(dtype, self.shape, needs_grad, f"{self.name}__{member}", _is_grad=_is_grad,
                                        needs_dual=needs_dual)
        self.grad = self._buffers("grad") if needs_grad else None
        self.dual = self._buffers("dual") if needs_dual else None

    @classmethod
    def of_members(cls, name: str, members: dict, struct_type=None, is_grad: bool = False) -> "StructField":
        """A struct field over existing member fields (a module loaded ahead of time, a .grad)."""
        sf = cls.__new__(cls)
        sf.struct_type, sf.name, sf.members, sf.is_grad = struct_type, name, members, is_grad
        sf.shape = next(iter(members.values())).shape
        sf.needs_grad = all(f.grad is not None for f in members.values())
        sf.grad = sf._buffers("grad") if sf.needs_grad and not is_grad else None
        sf.dual = sf._buffers("dual") if all(f.dual is not None for f in members.values()) and not is_grad else None
        return sf

    def _buffers(self, kind: str) -> "StructField":
        return StructField.of_members(f"{self.name}.{kind}", {k: getattr(f, kind) for k, f in self.members.items()},
                                      self.struct_type, is_grad=True)

    def set_name(self, name: str) -> None:
        """Rename the struct field and its members (`<name>__<member>`)."""
        self.name = name
        for member, f in self.members.items():
            f.set_name(f"{name}__{member}")
        for kind in ("grad", "dual"):
            if getattr(self, kind) is not None:
                setattr(self, kind, self._buffers(kind))

    def leaves(self) -> list:
        """(member path, Field) of every scalar/vector member, nested structs flattened."""
        out = []
        for member, f in self.members.items():
            out += [((member, *path), leaf) for path, leaf in f.leaves()] if isinstance(f, StructField) \
                else [((member,), f)]
        return out

    def __getattr__(self, name):
        members = self.__dict__.get("members")
        if members is not None and name in members:
            return members[name]
        raise AttributeError(f"struct field '{self.__dict__.get('name')}' has no member '{name}'")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def to_numpy(self) -> dict:
        """A dict of arrays, one per member (a nested struct: a nested dict)."""
        return {member: f.to_numpy() for member, f in self.members.items()}

    def from_numpy(self, arrays: dict) -> None:
        """Overwrite every member from a dict of arrays keyed by member name (as to_numpy gives)."""
        if not isinstance(arrays, dict) or set(arrays) != set(self.members):
            got = sorted(arrays) if isinstance(arrays, dict) else type(arrays).__name__
            raise ValueError(f"struct field '{self.name}': from_numpy needs a dict with the members "
                             f"{sorted(self.members)}, got {got}")
        for member, f in self.members.items():
            f.from_numpy(arrays[member])

    def fill(self, val) -> None:
        for f in self.members.values():
            f.fill(val)

    def __getitem__(self, key) -> dict:
        return element_proxy.struct_element(self, key)  # a dict whose members are also attributes

    def __setitem__(self, key, value: dict) -> None:
        for member, v in value.items():
            if member not in self.members:
                raise KeyError(f"struct field '{self.name}' has no member '{member}'")
            self.members[member][key] = v

    def __repr__(self):
        return f"<qdc struct field {self.name}: {list(self.members)}{list(self.shape)}>"


def struct_field(struct_type, shape=(), name=None, offset=None, needs_grad=False, needs_dual=False,
                 layout=None) -> StructField:
    if field_axes_order(f"struct {struct_type.name}.field", shape, None, offset, layout) is not None:
        raise NotImplementedError(f"layout={layout!r}: a struct field's axes are stored in declared order")
    return StructField(struct_type, shape, needs_grad, name, needs_dual=needs_dual)


device_arrays.install(field, ndarray, struct_field)  # what the language's constructors make (qd.Vector.field, ...)
