"""Device addresses for devices whose buffers have no pointer the host can write into ctx
words (Vulkan's VkBuffer, Metal's MTLBuffer): each allocation gets an address in a space of
the device's own, from 2^48 up (never 0, never a host address), spaced so that no two
allocations' ranges meet; the launcher writes those addresses into ctx words as it would device
pointers, and a launch maps each binding's word back to (allocation, offset)."""
from __future__ import annotations

import bisect

BASE = 1 << 48
ALIGN = 1 << 12


class AddressSpace:
    def __init__(self):
        self._next = BASE
        self._bases: list = []   # sorted allocation addresses
        self._by_base: dict = {}  # address -> Allocation

    def reserve(self, size: int) -> int:
        """A fresh address for `size` bytes (a gap of ALIGN after it)."""
        address = self._next
        self._next += -(-max(size, 1) // ALIGN) * ALIGN + ALIGN
        return address

    def add(self, alloc) -> None:
        bisect.insort(self._bases, alloc.ptr)
        self._by_base[alloc.ptr] = alloc

    def remove(self, address: int) -> None:
        del self._by_base[address]
        del self._bases[bisect.bisect_left(self._bases, address)]

    def lookup(self, address: int, extent):
        """(Allocation, byte offset) of `address`, if it falls inside an allocation's first
        `extent(alloc)` bytes; else None."""
        i = bisect.bisect_right(self._bases, address) - 1
        if i < 0:
            return None
        alloc = self._by_base[self._bases[i]]
        offset = address - alloc.ptr
        return (alloc, offset) if offset < extent(alloc) else None

    def allocations(self) -> list:
        return list(self._by_base.values())
