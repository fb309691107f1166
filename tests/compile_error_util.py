"""The located compile error a kernel call raises (never an internal compiler error)."""
import pytest

import qdc as qd


def compile_error(kernel, *args) -> qd.QdcCompileError:
    with pytest.raises(qd.QdcCompileError) as info:
        kernel(*args)
    assert "internal compiler error" not in str(info.value)
    return info.value
