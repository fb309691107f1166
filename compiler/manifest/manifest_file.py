"""The kernel manifest file: readable, diffable YAML, the same bytes for the same kernels.

    # qdc kernel manifest ...
    format: 1
    kernels:
    - module: app                      # the module's import name (never a path)
      kernel: step                     # its qualified name in the module (Solver.step for a method)
      variant: forward                 # forward, grad or forward_ad
      arches: [cpu]
      arguments:                       # the parameters as compiled (an ndarray's dtype and rank)
      - {name: dt, kind: scalar, dtype: f32}
      templates:                       # template arguments by value (driver/template_values.py)
        cfg: {object: {class: 'app:Config', attrs: {n: 8, ...}}}
      module_state:                    # module attributes it reads that are data, as they were
        'app:GRAVITY': -9.8
      options: {opt_level: 3, fast_math: false, ...}   # the options that change code
    - module: app
      kernel: legacy
      ...
      problem: "template argument 'cb' ...: cannot be described"   # recorded, cannot be built

Entries are sorted, and two that differ only in their arches are one entry (merging two runs'
manifests unions them). No entry holds a path, a host name or an environment variable.
`as_quadrants: true` (absent otherwise) says the program ran with `qdc.install_as_quadrants()`:
its modules `import quadrants`, which the build then resolves to qdc as well.
"""
from __future__ import annotations

import json
import os

FORMAT = 1
HEADER = ("# qdc kernel manifest: the kernel variants a program compiled or loaded (qdc record).\n"
          "# Build them ahead of time with: qdc build --manifest THIS_FILE --arch cpu,cuda,...\n")


class ManifestError(ValueError):
    """A manifest file that cannot be read."""


class Manifest(list):
    """A manifest's entries, and whether its program ran with qdc as quadrants."""

    def __init__(self, entries=(), as_quadrants: bool = False):
        super().__init__(entries)
        self.as_quadrants = bool(as_quadrants)


def identity(entry: dict) -> str:
    """What makes two entries the same variant (everything but the arches), as text."""
    return json.dumps({k: v for k, v in entry.items() if k != "arches"}, sort_keys=True)


def merge(*entry_lists) -> list:
    """One sorted list of entries, arches unioned between entries of the same variant."""
    merged: dict = {}
    for entries in entry_lists:
        for e in entries:
            key = identity(e)
            if key in merged:
                merged[key]["arches"] = sorted(set(merged[key]["arches"]) | set(e["arches"]))
            else:
                merged[key] = {**e, "arches": sorted(set(e["arches"]))}
    return [merged[k] for k in sorted(merged, key=lambda k: (merged[k]["module"], merged[k]["kernel"],
                                                             merged[k]["variant"], k))]


def dumps(entries: list, as_quadrants: bool = False) -> str:
    import yaml
    ordered = [{k: e[k] for k in _ORDER if k in e} for e in merge(entries)]
    top = {"format": FORMAT, **({"as_quadrants": True} if as_quadrants else {}), "kernels": ordered}
    body = yaml.dump(top, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper),
                     sort_keys=False, default_flow_style=None, width=120, allow_unicode=True)
    return HEADER + body


_ORDER = ("module", "kernel", "variant", "arches", "arguments", "templates", "module_state", "options", "problem")


def loads(text: str, where: str = "manifest") -> Manifest:
    import yaml
    try:
        # libyaml's parser where PyYAML has it: a large program's manifest holds 10^5 lines
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        data = yaml.load(text, Loader=loader) if text.strip() else {"format": FORMAT, "kernels": []}
    except yaml.YAMLError as e:
        raise ManifestError(f"{where}: not a kernel manifest: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("kernels", []), list):
        raise ManifestError(f"{where}: not a kernel manifest (expected 'format' and a 'kernels' list)")
    if data.get("format") != FORMAT:
        raise ManifestError(f"{where}: manifest format {data.get('format')!r}, this qdc reads format {FORMAT}")
    entries = data.get("kernels") or []
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not all(k in e for k in ("module", "kernel", "variant", "arches")):
            raise ManifestError(f"{where}: kernel entry {i + 1} lacks module, kernel, variant or arches")
    return Manifest(entries, data.get("as_quadrants", False))


def read(path: str) -> Manifest:
    try:
        with open(path, encoding="utf-8") as f:
            return loads(f.read(), path)
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such manifest") from None


def merge_into(path: str, entries: list, as_quadrants: bool = False) -> None:
    """Add `entries` to the manifest at `path` (created if absent), holding a lock on it so
    that several processes of one recording can each add theirs."""
    with open(path, "a+", encoding="utf-8") as f:
        _lock(f)
        f.seek(0)
        existing = loads(f.read(), path)
        text = dumps(existing + entries, existing.as_quadrants or as_quadrants)
        f.seek(0)
        f.truncate()
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _lock(f) -> None:
    try:
        import fcntl
    except ImportError:  # Windows: one recording process at a time
        return
    fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # released when the file is closed
