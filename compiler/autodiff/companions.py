"""The companion buffers of a kernel's globals, shared by reverse mode (gradients) and forward
mode (duals): in the compiled kernel either is addressed as a gradient buffer (`is_grad`
references). A field's companion is one more entry of the kernel's field table, added at its
first use; an ndarray's takes the gradient word of its parameter, which `Param.needs_grad`
says is bound."""
from __future__ import annotations

from .. import ir


class CompanionBuffers:
    """`kernel`'s companions of kind `attribute` ("grad" or "dual", the runtime Field's
    attribute holding it); `field_objects` are the runtime Fields of `kernel.fields`, in order,
    and get each companion field appended with its table entry."""

    def __init__(self, kernel: ir.KernelIR, field_objects: list, attribute: str):
        self.kernel, self.field_objects, self.attribute = kernel, field_objects, attribute
        self._field_refs: dict = {}  # field slot -> the reference to its companion

    def has(self, target) -> bool:
        if target.is_grad:
            return False
        if isinstance(target, ir.FieldRef):
            return getattr(self.field_objects[target.slot], self.attribute, None) is not None
        return bool(self.kernel.params[target.arg_index].needs_grad)

    def of(self, target):
        """The reference addressing the companion of `target` (one that `has`)."""
        if isinstance(target, ir.NdarrayRef):
            return ir.NdarrayRef(target.arg_index, target.name, target.dtype, target.ndim, True)
        ref = self._field_refs.get(target.slot)
        if ref is None:
            companion = getattr(self.field_objects[target.slot], self.attribute)
            ref = ir.FieldRef(len(self.kernel.fields), companion.name, companion.dtype,
                              tuple(companion.storage_shape), True)
            self.kernel.fields.append(ref)
            self.field_objects.append(companion)
            self._field_refs[target.slot] = ref
        return ref
