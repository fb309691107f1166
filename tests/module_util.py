"""Kernels in a source file of their own, for tests of where a compile error points: the
error names the file and line of the kernel source, which a test-local kernel would share
with the test itself."""
import importlib.util
import textwrap

import pytest

import qdc as qd


def compile_error_of(tmp_path, name: str, source: str, *args):
    """Write `source` (dedented) to tmp_path/<name>.py, import it and call its kernel `bad`
    with `args`, which must fail to compile: (the QdcCompileError, the file's path)."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(qd.QdcCompileError) as info:
        module.bad(*args)
    return info.value, path
