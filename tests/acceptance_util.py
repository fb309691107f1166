"""What the acceptance tests share: compile errors located at a marked source line."""
import os

import numpy as np
import pytest

import qdc as qd


def line_of(path: str, marker: str) -> int:
    """The line of `path` that ends with the comment `# marker` (exactly one)."""
    lines = open(path, encoding="utf-8").read().splitlines()
    hits = [i + 1 for i, t in enumerate(lines) if t.rstrip().endswith("# " + marker)]
    assert len(hits) == 1, marker
    return hits[0]


def compile_error_checker(path: str):
    """`check(fn, marker, *words)`: `fn()` raises a QdcCompileError located at the line of `path`
    marked `# marker`, as `file:line:col: error:`, mentioning every word; the message."""
    path = os.path.abspath(path)

    def check(fn, marker: str, *words):
        with pytest.raises(qd.QdcCompileError) as info:
            fn()
        msg = str(info.value)
        first = msg.splitlines()[0]
        assert first.startswith(f"{path}:{line_of(path, marker)}:"), msg
        assert ": error: " in first, msg
        assert "Traceback" not in msg
        for w in words:
            assert w.lower() in msg.lower(), (w, msg)
        return msg
    return check


def f32(rng, *shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, shape).astype(np.float32)
