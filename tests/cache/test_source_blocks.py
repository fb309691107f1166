"""The cache key reads a function's (and a template class's) source out of its file's lines, as
the block its code object and indentation delimit, without parsing the whole file
(compiler/driver/sources.py): the text must be exactly what the whole file's syntax tree says,
for every shape of definition, and a module rewritten and imported again must be keyed by its
new text."""
import gc
import importlib.util
import os
import sys
import textwrap

import pytest

import qdc as qd
from qdc.compiler.driver import cache_key, source_facts, sources
from qdc.compiler.jit.api import direct_options
from qdc.compiler.jit.kernel import kernel_of

SHAPES = '''
import dataclasses
import qdc as qd

SCALE = 2.0


@qd.func
def plain(v):
    return v * SCALE


@qd.kernel(
    fastcache=True)
def decorator_spanning_lines(v):
    return v + 1.0  # a comment
    # a comment after the last statement, indented


def trailing_pass(v):
    w = v
    pass


def string_at_the_margin(v):
    s = """
text at the margin
"""
    return v
def no_blank_line_before(v):
    return (v +
1.0)


async def asynchronous(v):
    return v


class Holder:
    scale = 3.0

    def method(self, v):
        def inner(u):
            return u * self.scale
        return inner(v)

    @staticmethod
    def static(v):
        return v.grad[0] + Holder.other.grad + (v * 2).grad


@dataclasses.dataclass(frozen=True)
class Frozen:
    n: int = 1

    def twice(self):
        return 2 * self.n


@dataclasses.dataclass(
    frozen=True)
class DecoratorOnTwoLines:
    n: int = 1


class Outer:
    class Inner:
        n = 1
def after_a_body():
    return 1
class NoBlankLineBefore:
    n = 2


text = """
class Shadowed:
    n = 3
"""


class Shadowed:
    n = 4
'''


def _import(tmp_path, name: str, text: str):
    path = tmp_path / f"{name}.py"
    path.write_text(text, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a class's source is found through its module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def shapes(tmp_path):
    return _import(tmp_path, "source_shapes", SHAPES)


FUNCTIONS = ["plain", "decorator_spanning_lines", "trailing_pass", "string_at_the_margin", "no_blank_line_before",
             "asynchronous", "Holder.method", "Holder.static"]


def _function(module, path: str):
    obj = module
    for part in path.split("."):
        obj = getattr(obj, part)
    return getattr(obj, "fn", obj)  # a qd.func's Python function


@pytest.mark.parametrize("path", FUNCTIONS)
def test_a_function_block_is_what_the_whole_file_says(shapes, path):
    fn = _function(shapes, path)
    by_file = sources._function_in_parsed_file(fn)
    got = sources.function_source(fn)
    assert by_file is not None
    assert got.text == by_file[0]
    want = sources.FunctionSource.of_tree(*by_file)
    assert got.chains == want.chains and got.grad_bases == want.grad_bases


def test_blocks_are_found_without_parsing_the_whole_file(shapes):
    for path in ("plain", "decorator_spanning_lines", "trailing_pass", "Holder.method", "Holder.static"):
        assert sources._function_block(_function(shapes, path)) is not None, path
    assert sources._top_level_class_span(sources.current_lines(shapes.__file__, None), "Frozen") is not None


def test_a_nested_function_and_a_lambda_have_their_source():
    def outer():
        def inner(v):
            return v + 1
        return inner
    assert sources.function_source(outer()).text.startswith("def inner(v):\n    return v + 1")
    twice = lambda v: v * 2  # noqa: E731
    assert "lambda v: v * 2" in sources.function_source(twice).text


def test_grad_reads_name_their_base_or_none(shapes):
    assert sources.function_source(_function(shapes, "Holder.static")).grad_bases == ["v", None, None]
    assert sources.function_source(_function(shapes, "plain")).grad_bases == []


@pytest.mark.parametrize("name", ["Holder", "Frozen", "DecoratorOnTwoLines", "Outer.Inner", "NoBlankLineBefore",
                                  "Shadowed"])
def test_a_class_block_is_what_the_whole_file_says(shapes, name):
    cls = _function(shapes, name)
    _, lines, classes, _ = sources._parsed_file(shapes.__file__, vars(shapes))
    first, last = classes[name]
    assert sources.class_source(cls) == "".join(lines[first - 1:last])


def test_the_key_follows_a_reached_function_rewritten_in_place(tmp_path):
    """The same file rewritten with an edit of the same length (a helper's constant) and
    imported again: the kernel's key is that of the new text, not of the lines read first."""
    text = textwrap.dedent('''
        import qdc as qd
        out = qd.field(qd.f32, shape=())

        @qd.func
        def helper(v):
            return v * 2.0

        @qd.kernel
        def k():
            out[None] = helper(1.0)
    ''')

    def key_of(module):
        kernel = kernel_of(module.k)
        return cache_key.kernel_key(kernel.fn, kernel.params, direct_options(), "cpu").key

    first = key_of(_import(tmp_path, "rewritten", text))
    path = tmp_path / "rewritten.py"
    stat = os.stat(path)
    path.write_text(text.replace("v * 2.0", "v * 3.0"), encoding="utf-8")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    second = key_of(_import(tmp_path, "rewritten", text.replace("v * 2.0", "v * 3.0")))
    assert first != second
    path.write_text(text, encoding="utf-8")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000))
    assert key_of(_import(tmp_path, "rewritten", text)) == first


def test_the_collector_is_held_off_only_while_keying():
    with sources.collection_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with sources.collection_paused():
            pass
        assert not gc.isenabled()  # a program that turned the collector off keeps it off
    finally:
        gc.enable()
    out = qd.field(qd.f32, shape=())

    @qd.kernel
    def k():
        out[None] = 1.0

    kernel = kernel_of(k)
    cache_key.kernel_key(kernel.fn, kernel.params, direct_options(), "cpu")
    assert gc.isenabled()


MULTI_LINE_SIGNATURE = '''
import qdc as qd


@qd.func
def spread(
    a,
    b,
):
    return a.grad + b
'''


@pytest.fixture
def facts_folder(tmp_path, monkeypatch):
    folder = tmp_path / "facts"
    monkeypatch.setitem(source_facts._state, "root", str(folder))
    return folder


def _fresh_source(fn):
    sources._SOURCES.pop(fn, None)
    return sources.function_source(fn)


def test_facts_kept_beside_the_cache_spare_the_next_process_parsing(tmp_path, facts_folder, monkeypatch):
    fn = _import(tmp_path, "signature_lines", MULTI_LINE_SIGNATURE).spread.fn
    first = _fresh_source(fn)
    assert (first.chains, first.grad_bases) == ([("a", "grad"), ("b",), ("qd", "func")], ["a"])
    assert first.text == sources._function_in_parsed_file(fn)[0]  # the signature's `):` did not end it
    assert len(list(facts_folder.rglob("*.msgpack"))) == 1

    def no_parsing(*args):
        raise AssertionError("parsed again")
    with monkeypatch.context() as m:
        m.setattr(sources, "_parse_block", no_parsing)
        again = _fresh_source(fn)
    assert (again.text, again.chains, again.grad_bases) == (first.text, first.chains, first.grad_bases)


def test_a_damaged_or_misplaced_facts_record_is_not_used(tmp_path, facts_folder, monkeypatch):
    fn = _import(tmp_path, "signature_lines", MULTI_LINE_SIGNATURE).spread.fn
    want = _fresh_source(fn)
    record, = facts_folder.rglob("*.msgpack")
    parsed = []
    real = sources._parse_block
    monkeypatch.setattr(sources, "_parse_block", lambda *a: parsed.append(1) or real(*a))
    data = record.read_bytes()
    other_text = _import(tmp_path, "other_lines", MULTI_LINE_SIGNATURE.replace("a.grad + b", "a.grad - b")).spread.fn
    _fresh_source(other_text)
    other, = (r for r in facts_folder.rglob("*.msgpack") if r != record)
    for damaged in (data[:-3] + bytes([data[-3] ^ 1]) + data[-2:], data[:10], b"", other.read_bytes()):
        record.write_bytes(damaged)
        parsed.clear()
        got = _fresh_source(fn)
        assert parsed and (got.text, got.chains, got.grad_bases) == (want.text, want.chains, want.grad_bases)


def test_facts_are_not_kept_where_trusted_keys_guard_the_cache(tmp_path):
    pytest.importorskip("cryptography")
    from qdc.runtime import signing
    signing.keygen(str(tmp_path / "ci.key"), "ci")
    try:
        qd.init(arch=qd.cpu, cache_dir=str(tmp_path / "signed"), trusted_keys=[str(tmp_path / "ci.key.pub")])
        assert source_facts._state["root"] is None
        qd.init(arch=qd.cpu, cache_dir=str(tmp_path / "plain"))
        assert source_facts._state["root"] == str(tmp_path / "plain" / source_facts.FOLDER)
    finally:
        qd.init(arch=qd.cpu)
