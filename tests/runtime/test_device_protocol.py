"""runtime/device.py declares the whole device protocol: everything the runtime outside
runtime/devices/ asks of a device is a member of `Device` (with a default where a device may
have nothing to say), and nothing probes a device for members with getattr/hasattr."""
import ast
import os

from qdc.runtime.device import Device

from conftest import REPO_ROOT

RUNTIME = os.path.join(REPO_ROOT, "runtime")
DEVICE_NAMES = {"device", "dev"}  # how the runtime names a device: `device.x`, `self.device.x`, `rt.device.x`
HOLDERS = {"self", "rt", "runtime"}  # ... and `context.current().device.x`, not a torch tensor's `a.device`


def _runtime_sources():
    for folder, subfolders, files in os.walk(RUNTIME):
        subfolders[:] = [d for d in subfolders if d not in ("devices", "__pycache__")]
        for name in files:
            if name.endswith(".py") and name != "device.py":
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    yield os.path.relpath(path, REPO_ROOT), ast.parse(f.read())


def _names_a_device(node) -> bool:
    if isinstance(node, ast.Name):
        return node.id in DEVICE_NAMES
    return isinstance(node, ast.Attribute) and node.attr in DEVICE_NAMES and (
        isinstance(node.value, ast.Call) or isinstance(node.value, ast.Name) and node.value.id in HOLDERS)


def test_the_runtime_asks_a_device_only_what_device_declares():
    undeclared, probes = [], []
    for path, tree in _runtime_sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _names_a_device(node.value) and not hasattr(Device, node.attr):
                undeclared.append(f"{path}:{node.lineno}: device.{node.attr}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                    and node.args and _names_a_device(node.args[0]):
                probes.append(f"{path}:{node.lineno}: {node.func.id}(device, ...)")
    assert not undeclared, "members of a device that runtime/device.py does not declare: " + ", ".join(undeclared)
    assert not probes, "the runtime probes devices instead of asking the protocol: " + ", ".join(probes)
