"""Helpers of the Vulkan device tests."""
from __future__ import annotations


def refuse_next_descriptor_set(dev, monkeypatch) -> None:
    """Make the Vulkan device `dev`'s descriptor pool look full at its next set allocation (lavapipe
    never runs out), so that the device resets the pool; `monkeypatch.undo()` restores it."""
    lib = dev.lib

    class FullPool:
        refused = False

        def __getattr__(self, name):
            return getattr(lib, name)

        def vkAllocateDescriptorSets(self, *args):
            if not self.refused:
                self.refused = True
                return dev.vk.VK_ERROR_OUT_OF_POOL_MEMORY
            return lib.vkAllocateDescriptorSets(*args)

    monkeypatch.setattr(dev, "lib", FullPool())


def hide_host_mapping(dev, monkeypatch) -> None:
    """Make the Vulkan device `dev` allocate its device-local memory without a host mapping, as a
    discrete GPU does: every write to it is then a command in the batch, every read a staged copy."""
    flags = list(dev._memory_flags)
    flags[dev._device_type] &= ~dev.vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
    monkeypatch.setattr(dev, "_memory_flags", flags)
