"""Keys, signed caches and the attacks on them, for the signed-artifact tests: what someone who
can write to a cache folder or a store (but holds no trusted private key) can do to an entry."""
from __future__ import annotations

import glob
import importlib
import os
import types

import pytest

from qdc.runtime import signing
from qdc.runtime.cache import META_FILE, entry_path, module_path
from qdc.runtime.contract import artifact as A

pytest.importorskip("cryptography")


def make_keys(folder) -> types.SimpleNamespace:
    """Key pairs by role: `ci` (what deployments trust), `next` (its successor), `attacker`. Each
    role has `<role>` (the private key file), `<role>_pub` and `<role>_key` (the SigningKey)."""
    out = types.SimpleNamespace()
    for role in ("ci", "next", "attacker"):
        path = os.path.join(folder, f"{role}.key")
        key = signing.keygen(path, role)
        setattr(out, role, path)
        setattr(out, f"{role}_pub", path + ".pub")
        setattr(out, f"{role}_key", key)
    return out


def entry_folder(cache, module: str, kernel: str, arch: str = "cpu") -> str:
    """The folder of the entry that `module`'s record names for `kernel` on `arch`."""
    record = read_plain_record(os.path.join(cache, module_path(module, arch)), A.MODULE_RECORD)
    return os.path.join(cache, entry_path(record["kernels"][kernel]))


def read_plain_record(path: str, kind: str) -> dict:
    with open(path, "rb") as f:
        return A.decode_record(f.read(), kind)


def write_record(path: str, kind: str, body: dict) -> None:
    with open(path, "wb") as f:
        f.write(A.encode_record(kind, body))


def signature_files(folder: str) -> list[str]:
    return sorted(glob.glob(os.path.join(folder, f"{signing.SIGNATURE_PREFIX}*")))


def sign_entry_as(folder: str, key: signing.SigningKey) -> None:
    """Sign the entry in `folder` as it stands now, with `key` (an attacker's, say)."""
    record = read_plain_record(os.path.join(folder, META_FILE), A.ENTRY_RECORD)
    name = signing.signature_file(key.public.fingerprint)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(signing.encode_signature(key.sign(A.ENTRY_RECORD, record)))


def rewrite_record(folder: str) -> None:
    """Change what the entry's record says of where it was built: no artifact changes, so the entry
    still loads where nothing is trusted, but it is no longer what was signed."""
    meta_path = os.path.join(folder, META_FILE)
    record = read_plain_record(meta_path, A.ENTRY_RECORD)
    record["source"] += " (rebuilt elsewhere)"
    write_record(meta_path, A.ENTRY_RECORD, record)


def replace_library(folder: str) -> str:
    """Change the entry's CPU library and re-compute its record's sha256 and size to match (what a
    writer without the key does to have other code run): the path of the library."""
    meta_path = os.path.join(folder, META_FILE)
    record = read_plain_record(meta_path, A.ENTRY_RECORD)
    info = record["artifacts"]["so"]
    path = os.path.join(folder, info["file"])
    with open(path, "rb") as f:
        data = f.read() + b"\0injected"  # still a loadable library: only the signature tells
    with open(path, "wb") as f:
        f.write(data)
    info.update(sha256=A.sha256(data), size=len(data))
    write_record(meta_path, A.ENTRY_RECORD, record)
    return path


class ModuleLoads:
    """Counts native code handed to the system: dlopen of CPU libraries, Vulkan shader modules."""

    def __init__(self, monkeypatch):
        self.count = 0
        for module, name in (("qdc.runtime.devices.cpu.device", "load_verified_library"),
                             ("qdc.runtime.devices.vulkan.pipelines", "_pipeline")):
            try:
                module = importlib.import_module(module)
            except ImportError:  # no Vulkan binding here: no shader module can be made either
                continue
            monkeypatch.setattr(module, name, self._counted(getattr(module, name)))

    def _counted(self, fn):
        def counted(*args, **kwargs):
            self.count += 1
            return fn(*args, **kwargs)
        return counted
