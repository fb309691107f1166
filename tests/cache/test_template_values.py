"""Template arguments described by value (compiler/driver/template_values.py): the description
is the same for equal arguments in any process, differs wherever the compiled code could, is
re-created by a build process (compiler/manifest/stand_ins.py) into an argument with the same
description and cache key, and an argument that cannot be described is named: a warning in
direct mode (the kernel is compiled, never cached), an error offline."""
from __future__ import annotations

import dataclasses
import enum
import re
import threading
import warnings

import numpy as np
import pytest

import qdc as qd
from qdc.compiler.driver import cache_key
from qdc.compiler.driver.template_values import Describer, Undescribable, brief, describe
from qdc.compiler.jit.api import direct_options
from qdc.compiler.jit.kernel import kernel_of
from qdc.compiler.manifest import manifest_file
from qdc.compiler.manifest.stand_ins import Rebuilder, rebuild


class Mode(enum.Enum):
    FAST = 1
    SLOW = 2


@dataclasses.dataclass(frozen=True)
class Limits:
    lo: float
    hi: float


@dataclasses.dataclass
class Bodies:  # not frozen: unhashable, still a template argument (by identity in a process)
    pos: object
    flags: tuple


class Config:
    def __init__(self, n, limits, bodies, mode=Mode.FAST):
        self.n, self.limits, self.bodies, self.mode = n, limits, bodies, mode
        self.dtype, self.eps = qd.f64, np.float32(1e-3)
        self.vec = qd.math.vec3


class Slots:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a, self.b = a, b


@qd.kernel
def clamp(cfg: qd.template()):
    for i in cfg.bodies.pos:
        v = cfg.bodies.pos[i]
        if qd.static(cfg.mode == Mode.FAST):
            v = v + cfg.eps
        cfg.bodies.pos[i] = qd.min(qd.max(v, cfg.limits.lo), cfg.limits.hi) * cfg.n


def _config(n=4, lo=0.0, hi=1.0, mode=Mode.FAST, name="pos"):
    return Config(n, Limits(lo, hi), Bodies(qd.field(qd.f32, shape=8, name=name), (1, "a", None)), mode)


def _key(cfg) -> str:
    kernel = kernel_of(clamp)
    return cache_key.kernel_key(kernel.fn, kernel.params, direct_options(), "cpu", "forward",
                                kernel.template_params.bind({"cfg": cfg})).key


def test_equal_arguments_have_one_description_and_key_and_others_differ():
    first, second = _config(), _config()
    assert describe(first, "cfg").data == describe(second, "cfg").data
    assert _key(first) == _key(second)  # two objects, one cache entry: each binds its own field
    others = [_config(n=5), _config(hi=2.0), _config(mode=Mode.SLOW), _config(name="other"), _config(lo=-0.0)]
    keys = {_key(c) for c in others} | {_key(first)}
    assert len(keys) == len(others) + 1
    first.limits = Limits(0.0, 1.5)  # an attribute changed: another description
    assert _key(first) != _key(second)


def test_fields_named_by_their_creation_count_do_not_split_the_key():
    qd.field(qd.f32, shape=3)  # another process may create more fields, or in another order
    first = Config(4, Limits(0.0, 1.0), Bodies(qd.field(qd.f32, shape=8), ()))
    qd.field(qd.i32, shape=5)
    second = Config(4, Limits(0.0, 1.0), Bodies(qd.field(qd.f32, shape=8), ()))
    assert first.bodies.pos.name != second.bodies.pos.name
    assert _key(first) == _key(second)
    bodies = describe(first, "cfg").data["object"]["attrs"]["bodies"]["object"]["attrs"]
    assert bodies["pos"]["field"]["name"] == "field*"


def test_descriptions_are_plain_data_that_rebuild_to_the_same_description():
    values = [None, True, 3, -0.0, float("inf"), "text", b"\x00\x01", 1 + 2j, np.float32(0.5), np.int64(-7),
              qd.f16, Mode.SLOW, (1, (2.0,)), [1, "b"], {"k": (1, 2)}, Limits(1.0, 2.0), _config(),
              Slots(1, Limits(0.5, 0.25)), qd.math.vec3, np.zeros((2, 3), np.float32),
              qd.ndarray(qd.f32, shape=(4, 2), needs_grad=True), qd.Vector.field(3, qd.f32, shape=(2,), name="v"),
              np.sin, Mode]
    for v in values:
        data = describe(v, "v").data
        text = manifest_file.dumps([{"module": "m", "kernel": "k", "variant": "forward", "arches": ["cpu"],
                                     "templates": {"v": data}}])
        read_back = manifest_file.loads(text)[0]["templates"]["v"]
        assert read_back == data or repr(read_back) == repr(data), (v, data)
        assert describe(rebuild(read_back, "v"), "v").data == data, v


def test_a_field_held_twice_is_described_once_and_shared_again_when_rebuilt():
    shared = qd.field(qd.f32, shape=8, name="shared")
    first, second = Bodies(shared, ()), Bodies(shared, (1,))
    describer = Describer()
    data = [describer.describe(first, "a").data, describer.describe(second, "b").data]
    assert data[1]["object"]["attrs"]["pos"] == {"field_ref": 0}
    rebuilder = Rebuilder()
    made = [rebuilder.rebuild(d, name) for d, name in zip(data, "ab")]
    assert made[0].pos is made[1].pos and made[0].pos.name == "shared"
    again = Describer()
    assert [again.describe(m, n).data for m, n in zip(made, "ab")] == data
    # two fields alike in everything are not one: a program that aliases is told apart from one that does not
    other = Describer()
    assert other.describe(Bodies(qd.field(qd.f32, shape=8, name="shared"), (1,)), "b").data != data[1]


def test_the_brief_form_names_what_an_instantiation_holds():
    text = brief(describe(_config(), "cfg").data, limit=400)
    assert text.startswith("Config(bodies=Bodies(flags=(1, 'a', None), pos=field(f32, shape=(8,)))")
    assert "mode=Mode.FAST" in text and "eps=np.float32(" in text


def test_what_cannot_be_described_is_named():
    cyclic = Limits(0.0, 1.0)
    looped = []
    looped.append(looped)  # a list that contains itself (an object that does is a back-reference)
    holder = Bodies(looped, ())
    for value, route in [(threading.Lock(), "cfg is a _thread.lock object"),
                         (Bodies(threading.Lock(), ()), "cfg.pos is a _thread.lock object"),
                         (holder, r"cfg.pos\[0\]: contains itself")]:
        with pytest.raises(Undescribable, match=route):
            describe(value, "cfg")
    assert describe(cyclic, "cfg").portable_problem is None
    assert "cannot be imported" in describe(lambda x: x, "cfg").portable_problem


@qd.kernel
def fill(cfg: qd.template()):
    for i in cfg.out:
        cfg.out[i] = cfg.value


class Holder:
    def __init__(self, out, value, extra):
        self.out, self.value, self.extra = out, value, extra


def test_an_undescribable_argument_warns_and_is_compiled_every_time(session_cache_dir):
    out = qd.field(qd.f32, shape=4, name="out")
    with pytest.warns(UserWarning, match=r"template argument 'cfg' of kernel 'fill': cfg.extra is a _thread.lock"):
        fill(Holder(out, 2.5, threading.Lock()))
    np.testing.assert_array_equal(out.to_numpy(), np.full(4, 2.5, np.float32))


def test_offline_never_compiles_and_names_what_is_missing(session_cache_dir):
    out = qd.field(qd.f32, shape=4, name="out")
    fill(Holder(out, 1.5, None))  # compiled and cached
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir, offline=True, cpu_target="native")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fill(Holder(out, 1.5, None))  # an equal argument: from the cache
    np.testing.assert_array_equal(out.to_numpy(), np.full(4, 1.5, np.float32))
    with pytest.raises(qd.KernelNotPrebuiltError, match=r"kernel '\S*fill' \(forward, cpu\) with "
                       r"cfg=Holder\(extra=None, out=field\(f32, shape=\(4,\)\), value=3.5\).*never compiles") as e:
        fill(Holder(out, 3.5, None))
    assert e.value.kernel.endswith("fill") and "value=3.5" in e.value.instantiation
    with pytest.raises(qd.KernelNotPrebuiltError, match="cannot be looked up: template argument 'cfg'"):
        fill(Holder(out, 1.5, threading.Lock()))
    assert isinstance(e.value, qd.CacheError)


def test_recording_names_an_instantiation_it_cannot_describe(tmp_path, monkeypatch):
    from qdc.compiler.manifest import recording
    path = tmp_path / "kernels.manifest"
    monkeypatch.setenv("QDC_RECORD", str(path))
    monkeypatch.setattr(recording, "_path_at_first_note", [])  # this test's manifest, then none again
    monkeypatch.setattr(recording, "_entries", {})
    out = qd.field(qd.f32, shape=4, name="out")
    with pytest.warns(UserWarning) as caught:
        fill(Holder(out, 0.5, threading.Lock()))
    messages = [str(w.message) for w in caught]
    assert any(re.match(r"qdc record: template argument 'cfg' of kernel '\S*test_template_values.fill' cannot be "
                        r"described: cfg.extra is a _thread.lock", m) for m in messages), messages
    fill(Holder(out, 0.5, None))
    recording.flush()
    kinds = sorted(("problem" in e, e["templates"]["cfg"] is None) for e in manifest_file.read(str(path)))
    assert kinds == [(False, False), (True, True)]  # recorded, not dropped: the build reports it
