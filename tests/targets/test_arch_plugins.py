"""An arch is a row of the arch table (runtime/contract/arches.py) and a Target that declares its
options: with a stand-in arch added to the table (and no other change), it is a `qd.<arch>`
constant, a `qdc build --arch` choice, its options are `qdc build` flags, Options attributes and
qdc.yaml keys, each checked by the option's own check, and `qdc build --arch <arch>` hands the
target those values and refuses a block_dim beyond its declared workgroup limit."""
from __future__ import annotations

import json
import textwrap

import pytest
from click.testing import CliRunner

import qdc as qd
from qdc.cli.main import cli
from qdc.compiler import targets
from qdc.compiler.driver.options import Options
from qdc.compiler.targets.base import Capabilities, Target, TargetOption
from qdc.runtime.cache import Cache, list_modules, read_module
from qdc.runtime.contract import arches

MAX_GROUP = 64


def _check_chip(value) -> None:
    if not str(value).startswith("chip"):
        raise ValueError(f"toy_chip must name a chip as chipN, got {value!r}")


class ToyTarget(Target):
    """A target whose one artifact records the options it was compiled with."""
    arch = "toy"
    display_name, workgroup_word = "Toy", "group"
    capabilities = Capabilities(max_workgroup_size=MAX_GROUP)
    options = (TargetOption("toy_level", help="How hard the toy target tries.", default=1, type=int, choices=(1, 2, 3)),
               TargetOption("toy_chip", help="The toy chip to build for.", default="chip0", validate=_check_chip))

    def cache_description(self, opts) -> str:
        return f"toy/{opts.effective('toy_level')}/{opts.effective('toy_chip')}"

    def launch_policy(self, task) -> dict:
        return {"policy": "grid", "block_dim": task.block_dim or 32}

    def generate(self, kernel, meta, opts) -> dict:
        seen = {"level": opts.effective("toy_level"), "chip": opts.effective("toy_chip"), "kernel": kernel.name}
        return {"toy": json.dumps(seen).encode()}


TARGET = ToyTarget()

KERNELS = '''
import qdc as qd

x = qd.field(qd.f32, shape=128)


@qd.kernel
def double():
    for i in x:
        x[i] = x[i] * 2.0
'''

WIDE = '''
import qdc as qd

x = qd.field(qd.f32, shape=128)


@qd.kernel
def wide():
    qd.loop_config(block_dim=128)
    for i in x:
        x[i] = 1.0
'''


@pytest.fixture
def toy_arch(monkeypatch):
    """The arch table with "toy" added: its target is this module's TARGET, with no device."""
    monkeypatch.setattr(arches, "TABLE", arches.TABLE + (arches.Arch("toy", gpu=False, target=__name__, device=None),))


def test_the_table_alone_makes_an_arch(toy_arch):
    assert qd.toy == "toy" and "toy" in targets.available() and targets.get("toy") is TARGET
    help_text = CliRunner().invoke(cli, ["build", "--help"]).output
    assert "cpu,cuda,vulkan,metal,amdgpu,toy" in help_text
    for flag, words in (("--toy-level [1|2|3]", "How hard"), ("--toy-chip TEXT", "The toy chip")):
        assert flag in help_text and words in help_text, help_text
    assert "--cpu-target" in help_text and "--cuda-arch" in help_text and "--amdgpu-targets" in help_text
    opts = Options(arch="toy").update(toy_level=3)
    assert (opts.toy_level, opts.toy_chip, opts.effective("toy_chip")) == (3, None, "chip0")


def test_without_its_row_the_arch_and_its_options_are_unknown(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.py").write_text(KERNELS, encoding="utf-8")
    r = CliRunner().invoke(cli, ["build", "k.py", "--arch", "toy"])
    assert r.exit_code == 2 and "unknown arch 'toy'" in r.output, r.output
    r = CliRunner().invoke(cli, ["build", "k.py", "--toy-level", "2"])
    assert r.exit_code == 2 and "No such option '--toy-level'" in r.output, r.output
    with pytest.raises(TypeError, match="unknown qdc option 'toy_level'"):
        Options().update(toy_level=2)


@pytest.mark.parametrize("args, message", [
    (["--toy-level", "7"], "toy_level must be one of 1, 2, 3, got 7"),
    (["--toy-level", "high"], "'high' is not a valid integer"),
    (["--toy-chip", "gpu9"], "toy_chip must name a chip as chipN, got 'gpu9'"),
])
def test_its_flags_are_checked_by_its_options(toy_arch, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.py").write_text(KERNELS, encoding="utf-8")
    r = CliRunner().invoke(cli, ["build", "k.py", "--arch", "toy", *args])
    assert r.exit_code == 2 and message in r.output, r.output


def test_its_options_come_from_flags_then_the_file(toy_arch, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.py").write_text(KERNELS, encoding="utf-8")
    (tmp_path / "qdc.yaml").write_text("toy_chip: chip7\ntoy-level: 2\n", encoding="utf-8")
    r = CliRunner().invoke(cli, ["build", "k.py", "--arch", "toy", "--cache", "c", "-j", "1"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["build", "k.py", "--arch", "toy", "--cache", "c", "-j", "1", "--toy-level", "3"])
    assert r.exit_code == 0, r.output
    cache = Cache(str(tmp_path / "c"))
    assert ("k", "toy") in list_modules(cache)
    seen = [json.loads(cache.lookup(e["key"]).artifacts["toy"]) for e in cache.entries()]
    assert sorted((s["level"], s["chip"], s["kernel"]) for s in seen) == [(2, "chip7", "double"),
                                                                          (3, "chip7", "double")]
    assert set(read_module(cache, "k", "toy")["kernels"]) == {"double"}

    (tmp_path / "qdc.yaml").write_text("toy_chip: gpu9\n", encoding="utf-8")
    r = CliRunner().invoke(cli, ["build", "k.py", "--arch", "toy", "--cache", "c", "-j", "1"])
    assert r.exit_code == 2 and "qdc.yaml: toy_chip must name a chip as chipN" in r.output, r.output


def test_a_block_dim_beyond_its_workgroup_limit_is_a_compile_error(toy_arch, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "wide.py").write_text(textwrap.dedent(WIDE), encoding="utf-8")
    r = CliRunner().invoke(cli, ["build", "wide.py", "--arch", "toy", "--cache", "c", "-j", "1"])
    assert r.exit_code == 1, r.output
    assert f"qd.loop_config(block_dim=128) is more threads per group than Toy allows ({MAX_GROUP})" in r.output
