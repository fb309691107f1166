"""Ahead of time for programs that do not declare their instantiations: `qdc record` writes a
manifest of every kernel variant a run compiled or loaded (template arguments by value),
`qdc build --manifest` builds it in another process and cache, and an offline process
(QDC_OFFLINE=1) runs from that cache with no compile and without importing llvmlite.

The program is tests/cache/manifest_app.py (config objects, dataclasses, an enum, a gradient,
an ndarray whose dtype follows the argument); every run is a fresh process, as in deployment.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from qdc.compiler.manifest import manifest_file

APP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "manifest_app.py")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("QDC_RECORD", "QDC_OFFLINE", "QDC_REMOTE")}
    here = os.path.dirname(os.path.dirname(os.path.dirname(APP)))  # the folder holding the qdc package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), here) if p)
    return {**env, **extra}


def _qdc(*args, cwd=None, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qdc.cli.main", *args], capture_output=True, text=True, cwd=cwd,
                          env=_env(**env), timeout=300)


def _app(app: str, cache, *args, **env) -> dict:
    r = subprocess.run([sys.executable, app, str(cache), *map(str, args)], capture_output=True, text=True,
                       env=_env(**env), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _check(result: dict, damping: float) -> None:
    sys.path.insert(0, os.path.dirname(APP))
    try:
        import manifest_app
    finally:
        sys.path.pop(0)
    want = manifest_app.expected(damping)
    for name in ("pos", "grad", "a", "vel"):
        np.testing.assert_allclose(result[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert result["loss"] == pytest.approx(want["loss"], rel=1e-5)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The app copied into a folder of its own, one run recorded (with the direct-mode cache
    `first`) and the manifest built in a fresh process into an empty cache `built`."""
    root = tmp_path_factory.mktemp("manifest")
    app = root / "app" / "manifest_app.py"
    app.parent.mkdir()
    shutil.copy(APP, app)
    manifest = root / "kernels.manifest"
    r = _qdc("record", "-o", str(manifest), "--", sys.executable, str(app), str(root / "first"))
    assert r.returncode == 0, r.stdout + r.stderr
    r = _qdc("build", "--manifest", str(manifest), "--cache", str(root / "built"), "-j", "1", cwd=str(app.parent))
    assert r.returncode == 0, r.stdout + r.stderr
    return root, app, manifest, r.stdout


def test_a_recorded_run_built_from_its_manifest_runs_offline_with_no_compile(recorded):
    root, app, manifest, build_output = recorded
    assert "6 built" in build_output, build_output
    entries = manifest_file.read(str(manifest))
    assert sorted((e["kernel"], e["variant"]) for e in entries) == [
        ("Damper.damp", "forward"), ("advance", "forward"), ("energy", "forward"), ("energy", "grad"),
        ("kick", "forward"), ("scale", "forward")]
    advance = next(e for e in entries if e["kernel"] == "advance")
    assert advance["module"] == "manifest_app" and advance["arches"] == ["cpu"]
    physics = advance["templates"]["cfg"]["object"]["attrs"]["physics"]["object"]
    assert physics["class"] == "manifest_app:Physics"
    assert physics["attrs"]["integrator"] == {"enum": {"class": "manifest_app:Integrator", "name": "DAMPED"}}
    kick = next(e for e in entries if e["kernel"] == "kick")
    assert kick["module_state"] == {"manifest_app:GRAVITY_SCALE": 2.0}  # set at run time: the build sets it too
    scale = next(e for e in entries if e["kernel"] == "scale")
    assert scale["arguments"][0] == {"name": "a", "kind": "ndarray", "dtype": "f64", "ndim": 1, "needs_grad": False}
    result = _app(str(app), root / "built", QDC_OFFLINE="1")
    _check(result, 0.1)
    assert result["compiled"] == 0 and result["from_cache"] == 6
    assert result["llvmlite"] is False  # an offline process never loads LLVM


def test_a_second_process_compiles_nothing(recorded, tmp_path):
    root, app, _, _ = recorded
    first = _app(str(app), tmp_path / "cache")
    second = _app(str(app), tmp_path / "cache")
    assert first["compiled"] == 6 and second["compiled"] == 0 and second["from_cache"] == 6
    _check(second, 0.1)


def test_an_instantiation_not_built_raises_naming_it(recorded):
    root, app, _, _ = recorded
    r = subprocess.run([sys.executable, str(app), str(root / "built"), "0.25"], capture_output=True, text=True,
                       env=_env(QDC_OFFLINE="1"), timeout=300)
    assert r.returncode != 0
    assert "KernelNotPrebuiltError" in r.stderr, r.stderr[-3000:]
    assert "kernel 'manifest_app.advance' (forward, cpu) with cfg=SolverConfig(" in r.stderr
    assert "damping=0.25" in r.stderr and "never compiles" in r.stderr


def test_manifests_of_two_runs_merge_and_rerecording_is_stable(recorded, tmp_path):
    root, app, manifest, _ = recorded
    merged = tmp_path / "merged.manifest"
    shutil.copy(manifest, merged)
    r = _qdc("record", "--append", "-o", str(merged), "--", sys.executable, str(app), str(tmp_path / "c"), "0.25")
    assert r.returncode == 0, r.stderr
    entries = manifest_file.read(str(merged))
    dampings = sorted(e["templates"]["cfg"]["object"]["attrs"]["physics"]["object"]["attrs"]["damping"]
                      for e in entries if e["kernel"] == "advance")
    assert dampings == [0.1, 0.25] and len(entries) == 8  # energy and scale are the same variants in both runs
    again = tmp_path / "again.manifest"
    r = _qdc("record", "-o", str(again), "--", sys.executable, str(app), str(tmp_path / "c"))
    assert r.returncode == 0, r.stderr
    assert again.read_text(encoding="utf-8") == manifest.read_text(encoding="utf-8")  # stable: same run, same bytes


def test_a_manifest_holds_no_path_and_builds_on_another_machine(recorded, tmp_path):
    root, app, manifest, _ = recorded
    text = manifest.read_text(encoding="utf-8")
    assert str(root) not in text and os.sep + "tmp" not in text and os.path.expanduser("~") not in text
    elsewhere = tmp_path / "checkout" / "src"  # the program's sources at another path
    elsewhere.mkdir(parents=True)
    shutil.copy(APP, elsewhere / "manifest_app.py")
    shutil.copy(manifest, tmp_path / "kernels.manifest")
    r = _qdc("build", "--manifest", str(tmp_path / "kernels.manifest"), "--cache", str(tmp_path / "built"),
             "-j", "1", cwd=str(elsewhere))
    assert r.returncode == 0 and "6 built" in r.stdout, r.stdout + r.stderr
    result = _app(str(elsewhere / "manifest_app.py"), tmp_path / "built", QDC_OFFLINE="1")
    assert result["compiled"] == 0
    _check(result, 0.1)


def test_stale_entries_are_reported_and_the_rest_built(recorded, tmp_path):
    root, app, manifest, _ = recorded
    entries = manifest_file.read(str(manifest))
    for e in entries:
        if e["kernel"] == "scale":
            e["kernel"] = "rescale"  # renamed since it was recorded
        if e["kernel"] == "energy" and e["variant"] == "grad":
            e["templates"]["state"]["object"]["class"] = "manifest_app:OldState"  # a class gone
    stale = tmp_path / "stale.manifest"
    stale.write_text(manifest_file.dumps(entries), encoding="utf-8")
    r = _qdc("build", "--manifest", str(stale), "--cache", str(tmp_path / "built"), "-j", "1",
             cwd=str(app.parent))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "stale manifest entry manifest_app.rescale (forward)" in r.stderr
    assert "module manifest_app has no @qd.kernel rescale" in r.stderr
    assert "stale manifest entry manifest_app.energy (grad)" in r.stderr and "has no OldState" in r.stderr
    assert "4 built" in r.stdout and "2 stale manifest entries" in r.stdout, r.stdout


def test_shards_of_a_manifest_build_merge_pack_and_serve_an_offline_process_from_a_store(recorded, tmp_path):
    pytest.importorskip("obstore")
    root, app, manifest, _ = recorded
    store = tmp_path / "store"
    store.mkdir()
    url = store.as_uri()
    outputs = []
    for k in (1, 2):
        r = _qdc("build", "--manifest", str(manifest), "--cache", str(tmp_path / f"shard{k}"), "-j", "1",
                 "--shard", f"{k}/2", "--remote", url, cwd=str(app.parent))
        assert r.returncode == 0, r.stdout + r.stderr
        outputs.append(r.stdout)
    built = [int(re.search(r"(\d+) built", out).group(1)) for out in outputs]
    assert sum(built) == 6 and all(built), outputs  # the shards share the work
    r = _qdc("merge", str(tmp_path / "merged"), str(tmp_path / "shard1"), str(tmp_path / "shard2"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert _app(str(app), tmp_path / "merged", QDC_OFFLINE="1")["compiled"] == 0
    # packed into one file, verified, and unpacked into a deployment's cache by `qdc merge`
    bundle = str(tmp_path / "kernels.qdc.tar.gz")
    for args in (["pack", "--cache", str(tmp_path / "merged"), "-o", bundle], ["verify", bundle],
                 ["merge", str(tmp_path / "deployed"), bundle]):
        r = _qdc(*args)
        assert r.returncode == 0, (args, r.stdout + r.stderr)
    assert _app(str(app), tmp_path / "deployed", QDC_OFFLINE="1")["compiled"] == 0
    # a deployment with an empty cache takes every variant from the store, verified
    result = _app(str(app), tmp_path / "empty", QDC_OFFLINE="1", QDC_REMOTE=url)
    assert result["compiled"] == 0 and result["from_cache"] == 6 and not result["llvmlite"]
    _check(result, 0.1)


QUADRANTS_PROGRAM = {
    "sim/__init__.py": "",
    "sim/solver.py": '''
import quadrants as qd


@qd.data_oriented
class Solver:
    def __init__(self, n, iterations):
        self.x = qd.field(qd.f32, shape=n)
        self.iterations = iterations

    @qd.kernel
    def relax(self, step: qd.f32):
        for i in self.x:
            for _ in qd.static(range(self.iterations)):
                self.x[i] += step
''',
    "main.py": '''
import json
import sys

import qdc
qdc.install_as_quadrants()
import quadrants as qd
from sim.solver import Solver

qd.init(arch=qd.cpu, cache_dir=sys.argv[1])
s = Solver(4, 3)
s.relax(0.5)
from qdc.compiler.jit.offline_cache import Counts
print(json.dumps({"x": s.x.to_numpy().tolist(), "compiled": Counts.compiled, "llvmlite": "llvmlite" in sys.modules}))
''',
}


def test_a_quadrants_program_in_a_package_is_recorded_built_and_run_offline(tmp_path):
    for name, text in QUADRANTS_PROGRAM.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    main = str(tmp_path / "main.py")
    r = _qdc("record", "-o", "kernels.manifest", "--", sys.executable, main, "first", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    entry, = manifest_file.read(str(tmp_path / "kernels.manifest"))
    assert (entry["module"], entry["kernel"]) == ("sim.solver", "Solver.relax")
    r = _qdc("build", "--manifest", "kernels.manifest", "--cache", "built", "-j", "1", cwd=str(tmp_path))
    assert r.returncode == 0 and "1 built" in r.stdout, r.stdout + r.stderr
    result = _app(main, tmp_path / "built", QDC_OFFLINE="1")
    assert result == {"x": [1.5] * 4, "compiled": 0, "llvmlite": False}


MODULE_KERNELS = '''
import qdc as qd

x = qd.field(qd.f32, shape=8, needs_grad=True)
total = qd.field(qd.f32, shape=(), needs_grad=True)


@qd.kernel
def norm2():
    for i in x:
        total[None] += x[i] * x[i]
'''

MODULE_USER = '''
import json
import sys

import numpy as np
import qdc as qd

qd.init(arch=qd.cpu, cache_dir=sys.argv[1])
import physics
physics.x.from_numpy(np.arange(8, dtype=np.float32))
physics.norm2()
physics.total.grad[None] = 1.0
physics.norm2.grad()
from qdc.compiler.jit.offline_cache import Counts
print(json.dumps({"total": physics.total[None], "grad": physics.x.grad.to_numpy().tolist(),
                  "compiled": Counts.compiled, "llvmlite": "llvmlite" in sys.modules}))
'''


def test_an_offline_process_runs_what_qdc_build_built_from_a_kernel_module(tmp_path):
    (tmp_path / "physics.py").write_text(MODULE_KERNELS, encoding="utf-8")
    (tmp_path / "main.py").write_text(MODULE_USER, encoding="utf-8")
    r = _qdc("build", "physics.py", "--cache", "cache", "-j", "1", cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    result = _app(str(tmp_path / "main.py"), tmp_path / "cache", QDC_OFFLINE="1")
    assert result == {"total": 140.0, "grad": [2.0 * i for i in range(8)], "compiled": 0, "llvmlite": False}


class _Items(list):
    """A list of a class of its own that holds nothing but its items."""


class _Tagged(list):
    def __init__(self, items):
        super().__init__(items)
        self.tag = "kept apart"


def test_a_plain_container_subclass_is_described_by_its_items_and_rebuilt():
    from qdc.compiler.driver import template_values
    from qdc.compiler.manifest import stand_ins
    data = template_values.describe({"entities": _Items([1, 2.5, (3, "x")])}, "cfg").data
    assert data == {"dict": [["entities", {"container": {"class": f"{__name__}:_Items",
                                                         "items": {"list": [1, 2.5, {"tuple": [3, "x"]}]}}}]]}
    rebuilt = stand_ins.rebuild(data, "cfg")["entities"]
    assert type(rebuilt) is _Items and rebuilt == [1, 2.5, (3, "x")]
    with pytest.raises(template_values.Undescribable, match="cannot be described by value"):
        template_values.describe(_Tagged([1]), "cfg")  # its own attribute is not in its items
    looped = _Items()
    looped.append(looped)
    with pytest.raises(template_values.Undescribable, match="contains itself"):
        template_values.describe(looped, "cfg")


def test_sets_are_described_in_a_canonical_order_and_rebuilt():
    from qdc.compiler.driver import template_values
    from qdc.compiler.manifest import stand_ins
    first = template_values.describe({"changes": {"b", "a", 3}, "frozen": frozenset({(1, 2), (0, 5)})}, "cfg").data
    again = template_values.describe({"changes": {3, "a", "b"}, "frozen": frozenset({(0, 5), (1, 2)})}, "cfg").data
    assert first == again
    assert template_values.describe({"changes": {"a", "c"}}, "cfg").data != \
        template_values.describe({"changes": {"a", "b"}}, "cfg").data
    rebuilt = stand_ins.rebuild(first, "cfg")
    assert rebuilt == {"changes": {"a", "b", 3}, "frozen": frozenset({(1, 2), (0, 5)})}
    assert type(rebuilt["frozen"]) is frozenset


class _Node:
    pass


def test_a_cycle_of_objects_is_described_by_back_references_and_rebuilt():
    from qdc.compiler.driver import template_values
    from qdc.compiler.manifest import stand_ins
    solver, entity = _Node(), _Node()
    solver.entities, solver.dt = [entity], 0.01
    entity.solver, entity.n = solver, 4  # entity -> solver -> its list -> entity
    data = template_values.describe(solver, "self").data
    rebuilt = stand_ins.rebuild(data, "self")
    assert rebuilt.entities[0].solver is rebuilt and rebuilt.entities[0].n == 4 and rebuilt.dt == 0.01
    other = _Node()
    other.entities, other.dt = [_Node()], 0.01
    other.entities[0].solver, other.entities[0].n = _Node(), 4  # the same shape, but no cycle
    other.entities[0].solver.entities, other.entities[0].solver.dt = [], 0.01
    assert template_values.describe(other, "self").data != data
