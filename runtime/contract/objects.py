"""How the compiler recognises the runtime's data objects without importing them.

A kernel's source reaches fields (module-level arrays) and `qd.ndarray`s by name; the front
end, the cache key and the template machinery tell them apart by these marker classes, which
runtime/fields.py's Field and Ndarray derive from. What the compiler reads of a field is its
declaration: `name`, `dtype`, `shape`, `element_shape`, `needs_grad`, `is_grad`, `grad`
(and `needs_dual`, `dual`); of an ndarray its `dtype`, `storage_shape`, `element_shape`,
`grad` and `dual`."""


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

