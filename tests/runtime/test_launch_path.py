"""One function chooses a launcher's path (runtime/launch_path.py) and says why; the launcher
takes that path, and `qdc inspect` shows it."""
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

import qdc as qd
from qdc.cli.main import cli
from qdc.runtime.device import DeviceCapabilities
from qdc.runtime.launch_path import choose_launch_path


def _device(fused: bool, graphs: bool = False, sync_each_launch: bool = False, loops_refused=None):
    caps = DeviceCapabilities(host_memory=fused, synchronous=fused, fused_launch=fused)
    return SimpleNamespace(arch="cpu" if fused else "gpu", capabilities=caps, has_graphs=graphs,
                           sync_each_launch=sync_each_launch, device_loops=lambda: loops_refused)


@pytest.mark.parametrize("case, expected, why", [
    (dict(device=_device(True), python_entry=object(), binding=object()), "python_entry", "one builtin call"),
    (dict(device=_device(True), binding=object()), "native_binding", "binds numpy arrays itself"),
    (dict(device=_device(True), hooked_by=["adstacks"]), "fused", "launch hooks (adstacks)"),
    (dict(device=_device(False, graphs=True), graph=True, hooked_by=["adstacks"]), "graph", "one graph"),
    (dict(device=_device(False), graph=True), "fixed_tasks", "has no graphs"),
    (dict(device=_device(False), slices_fixed=False), "tasks", "trip count is evaluated at every launch"),
    (dict(device=_device(False), hooked_by=["debug checks", "print"]), "tasks", "launch hooks (debug checks, print)"),
    (dict(device=_device(False, sync_each_launch=True)), "tasks", "a sync after every launch"),
    (dict(device=_device(False, graphs=True), graph=True, graph_loops=True), "device_loops", "conditional WHILE"),
    (dict(device=_device(False, graphs=True, loops_refused="the driver is CUDA 12.2"), graph=True, graph_loops=True),
     "graph_loops", "(the driver is CUDA 12.2)"),
    (dict(device=_device(False, graphs=True), graph_loops=True), "graph_loops", "not graph=True"),
])
def test_the_path_and_why(case, expected, why):
    args = dict(hooked_by=[], graph=False, binding=None, python_entry=None, slices_fixed=True) | case
    path = choose_launch_path(**args)
    assert path.name == expected and why in path.why, path


def test_the_launcher_takes_the_path_it_names(session_cache_dir):
    qd.init(arch=qd.cpu, cache_dir=session_cache_dir)
    a = np.ones(8, np.float32)

    @qd.kernel
    def scale(x: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32):
        for i in range(x.shape[0]):
            x[i] = x[i] * s

    scale(a, 2.0)
    state = scale.__qdc_launcher__
    expected = "python_entry" if state.python is not None else "native_binding" if state.binding is not None else "fused"
    assert state.path.name == expected
    if state.binding is not None:  # the library's entry is the native call
        assert state.g["_q_call"] == state.binding.call

    qd.init(arch=qd.cpu, cache_dir=session_cache_dir, debug=True)
    scale(a, 2.0)
    state = scale.__qdc_launcher__
    assert state.path.name == "fused" and "debug checks" in state.path.why
    np.testing.assert_array_equal(a, np.full(8, 4, np.float32))


def test_inspect_shows_the_launch_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scaling.py").write_text(
        "import qdc as qd\n\n\n@qd.kernel\ndef scale(x: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32):\n"
        "    for i in range(x.shape[0]):\n        x[i] = x[i] * s\n", encoding="utf-8")
    runner = CliRunner()
    assert runner.invoke(cli, ["build", "scaling.py", "--cache", "c", "-j", "1"]).exit_code == 0
    r = runner.invoke(cli, ["inspect", "scaling.scale", "--cache", "c"])
    assert r.exit_code == 0, r.output
    line = next(line for line in r.output.splitlines() if line.startswith("  launch    "))
    assert line.split()[1].rstrip(":") in ("python_entry", "native_binding"), line
    r = runner.invoke(cli, ["inspect", "scaling.scale", "--cache", "c", "--arch", "metal"])
    assert r.exit_code == 1  # not built for metal: nothing to show
