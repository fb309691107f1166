"""The artifacts of an LLVM-based target whose optimised module is kept as bitcode ("bc"), its
textual IR ("ll") written from that bitcode only when something reads it.

The offline cache stores the bitcode and never the text (`qdc inspect --llvm` disassembles the
bitcode), so printing every kernel's optimised module, a quarter of a second of a Genesis scene's
build, served only the tests and callers that read "ll".
"""
from __future__ import annotations

import llvmlite.binding as llvm


class LlvmArtifacts(dict):
    """A dict of artifacts (kind -> bytes) in which `artifacts["ll"]` and `artifacts.get("ll")`
    are the text of the "bc" module, disassembled on first use and then kept. Iterating, or
    `"ll" in artifacts`, shows only what is held: what stores the artifacts (the offline cache)
    never makes the text."""

    def __missing__(self, kind):
        if kind != "ll" or "bc" not in self:
            raise KeyError(kind)
        text = self["ll"] = str(llvm.parse_bitcode(self["bc"], llvm.create_context())).encode()
        return text

    def get(self, kind, default=None):
        try:
            return self[kind]
        except KeyError:
            return default
