"""How the compiler recognises the runtime's data objects without importing them.

A kernel's source reaches fields (module-level arrays) and `qd.ndarray`s by name; the front
end, the cache key and the template machinery tell them apart by these marker classes, which
runtime/fields.py's Field and Ndarray derive from. What the compiler reads of a field is its
declaration: `name`, `dtype`, `shape`, `element_shape`, `needs_grad`, `is_grad`, `grad`
(and `needs_dual`, `dual`); of an ndarray its `dtype`, `storage_shape`, `element_shape`,
`grad` and `dual`."""
import abc


class FieldMarker:
    """Base of every field object."""
    __slots__ = ()


class NdarrayMarker:
    """Base of every device ndarray object."""
    __slots__ = ()


class StructFieldMarker:
    """Base of every struct field (one field per member, runtime/fields.py's StructField): the
    compiler reads its `name`, `shape`, `members` (name -> field or struct field), `grad`."""
    __slots__ = ()


class Tensor(abc.ABC):
    """`qd.Tensor` (Quadrants' tensor API, runtime/tensors.py): every field and ndarray is one;
    as a kernel parameter annotation it takes either (an array argument whose dtype and ndim are
    the argument's)."""

    @classmethod
    def __subclasshook__(cls, sub):
        if cls is Tensor:
            return issubclass(sub, (FieldMarker, NdarrayMarker)) or NotImplemented
        return NotImplemented


class _ElementRank(abc.ABCMeta):
    """`isinstance` of VectorTensor/MatrixTensor: a field or ndarray whose elements have that rank."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, (FieldMarker, NdarrayMarker)) and len(obj.element_shape) == cls.element_rank

    def __subclasscheck__(cls, sub):
        return False


VectorTensor = _ElementRank("VectorTensor", (Tensor,), {
    "element_rank": 1, "__module__": __name__, "__doc__": "A field or ndarray of vectors (`qd.Vector.tensor`)."})
MatrixTensor = _ElementRank("MatrixTensor", (Tensor,), {
    "element_rank": 2, "__module__": __name__, "__doc__": "A field or ndarray of matrices (`qd.Matrix.tensor`)."})
