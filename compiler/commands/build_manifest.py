"""`qdc build --manifest FILE`: build exactly the kernel variants a recorded manifest lists.

Each entry is re-created in this process: its module imported by name (the folder of the
manifest and the working folder are on the import path, as for `python -m`), its kernel found
by qualified name, its template arguments re-created from their descriptions
(driver/template_values.py, `rebuild`: config objects without running their `__init__`, fields
and ndarrays as stand-ins of the recorded declarations) and its parameters taken as recorded
(an ndarray's dtype and rank as the recording run's arguments had them). The module attributes
a kernel reads that are data (`module_state`: numbers, dtypes, fields, config objects) are set as
the recording process had them wherever they differ here, since a program may set them at run
time (Genesis sets `gs.qd_float` in `gs.init()`). Compiled through the
usual build (commands/build.py: shards, workers, remote store), each variant gets the cache key the
recording process computed, so a process of the program finds it, also offline.

An entry the program no longer matches (its module or kernel renamed or gone, its template
parameters or arguments changed, a class of a template argument gone) is stale: reported by
name and reason, while the rest is built; the build then exits 1. Each entry built gets a module
record of its own (`load_entries`), so `qdc pack`, `qdc verify`, `qdc merge` and `--remote` carry
and check manifest builds as they do kernel modules.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import sys
import time

from qdc.runtime.contract import types as T
from qdc.runtime.contract.python_scope import scope_types

from .. import ir
from . import build as build_mod
from ..driver import template_values
from ..driver.templates import TemplateArgs
from ..jit.aot import Instantiation
from ..jit.kernel import kernel_of
from ..manifest import manifest_file, stand_ins


class StaleEntry(Exception):
    """The program no longer matches a manifest entry."""


class ManifestKernel(Instantiation):
    """One manifest entry re-created: the kernel, its template arguments, and the variant,
    parameters and code options it was recorded with (build.py asks for them by name)."""
    # Its entries serve direct-mode processes of the program, which read arrays off their own
    # template arguments at launch (a module loaded by `qdc.runtime.load` could not)
    serves_direct_mode = True

    def __init__(self, kernel, templates, entry: dict):
        super().__init__(kernel, templates)
        self.entry = entry
        self.variant = entry["variant"]

    def __repr__(self):
        return f"<qdc manifest entry {entry_title(self.entry)}>"

    def options_over(self, opts):
        """The build's options with the entry's code options (opt_level, default_fp, ...)."""
        values = {}
        for name, v in (self.entry.get("options") or {}).items():
            if name in opts.CODE_AFFECTING:
                values[name] = T.by_name(v) if name in ("default_fp", "default_ip") else v
        return opts.copy(**values)

    def recorded_params(self, opts) -> list:
        """The parameters as recorded, checked against the kernel's annotations today."""
        current = [p for p in self.kernel.params_for(opts) if p.kind != "dataclass"]  # those are among the templates
        recorded = self.entry.get("arguments") or []
        names = [a.get("name") for a in recorded]
        if names != [p.name for p in current]:
            raise StaleEntry(f"its parameters are now ({', '.join(p.name for p in current)}), recorded "
                             f"({', '.join(map(str, names))})")
        return [_recorded_param(p, a) for p, a in zip(current, recorded)]


def _recorded_param(p: ir.Param, a: dict) -> ir.Param:
    if a.get("kind") != p.kind:
        raise StaleEntry(f"parameter '{p.name}' is now a {p.kind} parameter, recorded as {a.get('kind')}")
    dtype = T.by_name(a["dtype"]) if a.get("dtype") else None
    if p.kind != "ndarray":
        if p.dtype is not None and dtype is not None and p.dtype is not dtype:
            raise StaleEntry(f"parameter '{p.name}' is now {p.dtype}, recorded as {dtype}")
        return p
    if p.dtype is not None and p.dtype is not dtype or p.ndim is not None and p.ndim != a.get("ndim"):
        raise StaleEntry(f"ndarray parameter '{p.name}' is now {p!r}, recorded as {a.get('dtype')} with ndim "
                         f"{a.get('ndim')}")
    layout = tuple(a["layout"]) if a.get("layout") else None  # the storage order the argument had
    return ir.Param(p.name, "ndarray", dtype, a["ndim"], a.get("needs_grad"), tuple(a.get("element_shape") or ()),
                    layout)


def entry_title(e: dict) -> str:
    """`app.step (grad) with cfg=Config(n=8, ...)`, how reports name an entry."""
    shown = ", ".join(f"{k}={template_values.brief(d, 60) if d is not None else '?'}"
                      for k, d in (e.get("templates") or {}).items())
    return f"{e['module']}.{e['kernel']} ({e['variant']})" + (f" with {shown}" if shown else "")


def recreate(e: dict, opts) -> ManifestKernel:
    """The entry's kernel and template arguments in this process; StaleEntry saying why not."""
    if e.get("problem"):
        raise StaleEntry(f"it was recorded but cannot be built: {e['problem']}")
    if e["variant"] not in ("forward", "grad", "forward_ad"):
        raise StaleEntry(f"unknown variant '{e['variant']}'")
    try:
        module = importlib.import_module(e["module"])
    except Exception as err:  # noqa: BLE001 (any failure of the program's import)
        raise StaleEntry(f"module {e['module']} cannot be imported ({type(err).__name__}: {err})") from None
    _restore_module_state(e)
    kernel = kernel_of(_attribute_path(module, e["kernel"]))
    if kernel is None:
        raise StaleEntry(f"module {e['module']} has no @qd.kernel {e['kernel']}")
    params = kernel.template_params
    recorded = e.get("templates") or {}
    names = params.names if params is not None else []
    # a dataclass parameter's argument is compiled in as a template's is (jit/kernel.py, _with_dataclasses)
    dataclasses = [p.name for p in kernel.params_for(opts) if p.kind == "dataclass"]
    if sorted(names + dataclasses) != sorted(recorded):
        raise StaleEntry(f"its template and dataclass parameters are now ({', '.join(names + dataclasses)}), "
                         f"recorded ({', '.join(recorded)})")
    try:
        rebuilder = stand_ins.Rebuilder()  # one for all the arguments: fields they share stay shared
        values = {name: rebuilder.rebuild(d, name) for name, d in recorded.items()}
    except stand_ins.Unrebuildable as err:
        raise StaleEntry(str(err)) from None
    templates = params.bind({n: values[n] for n in names}) if params is not None else None
    if dataclasses:
        merged = TemplateArgs.__new__(TemplateArgs)
        merged.values = {**(templates.values if templates is not None else {}), **{n: values[n] for n in dataclasses}}
        merged.key = ()
        templates = merged
    made = ManifestKernel(kernel, templates, e)
    made.recorded_params(made.options_over(opts))  # checked now: a stale entry is reported, not failed
    return made


def _restore_module_state(e: dict) -> None:
    """Set the module attributes the kernel read as the recording process had them, where this
    process has them otherwise (a program sets some at run time: `gs.qd_float` in `gs.init()`)."""
    for name, recorded in (e.get("module_state") or {}).items():
        module_name, _, attr = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception as err:  # noqa: BLE001 (any failure of the program's import)
            raise StaleEntry(f"module {module_name} cannot be imported ({type(err).__name__}: {err})") from None
        try:
            now = template_values.describe(getattr(module, attr), name).data if hasattr(module, attr) else None
        except template_values.Undescribable:
            now = None
        if now != recorded:
            try:
                setattr(module, attr, stand_ins.rebuild(recorded, name))
            except stand_ins.Unrebuildable as err:
                raise StaleEntry(str(err)) from None


def _attribute_path(module, qualname: str):
    """The object `qualname` names in `module` (a method through its class's own dict)."""
    obj = module
    for part in qualname.split("."):
        if part == "<locals>":
            return None
        obj = inspect.getattr_static(obj, part, None) if isinstance(obj, type) else getattr(obj, part, None)
        obj = getattr(obj, "__func__", obj)  # a staticmethod or classmethod
    return obj


def load_entries(entries: list, opts, log) -> tuple[list, list]:
    """(module sources for the build, stale entries' messages). Each entry is a module source of
    its own, `<module>-<digest of the entry>` holding the one kernel variant: its module record
    names the entry and the fields it binds, so that `qdc pack` and `qdc verify` take it as they
    take a kernel module's (a program's own processes look entries up by key, not by record)."""
    sources = []
    stale = []
    with scope_types.importing(opts.default_ip, opts.default_fp):
        for e in entries:
            try:
                made = recreate(e, opts)
            except StaleEntry as why:
                stale.append(f"qdc build: stale manifest entry {entry_title(e)}: {why}")
                log(stale[-1])
                continue
            module = sys.modules[e["module"]]
            path = os.path.abspath(getattr(module, "__file__", None) or e["module"])
            digest = hashlib.sha256(manifest_file.identity(e).encode()).hexdigest()[:10]
            src = build_mod.ModuleSource(path, f"{e['module']}-{digest}", module)
            src.kernels[e["kernel"].rpartition(".")[2]] = made
            sources.append(src)
    return sources, stale


def build_manifest(path: str, arches, opts, cache_dir: str, jobs: int = 1, force: bool = False, log=None,
                   out=None, verbose: bool = False, skip_unexpressible: bool = False, shard=None,
                   remote: str | None = None, show_timings: bool = False, signer=None) -> build_mod.BuildReport:
    """Build every entry of the manifest at `path` for `arches` (None: the arches it records);
    `signer` signs what the build holds, as `qdc build --sign` (build.py)."""
    log = log or (lambda text: print(text, file=sys.stderr, flush=True))
    out = out or (lambda text: print(text, flush=True))
    t0 = time.perf_counter()
    try:
        entries = manifest_file.read(path)
    except manifest_file.ManifestError as e:
        raise build_mod.BuildUsageError(str(e)) from None
    if arches is None:
        arches = build_mod.resolve_arches(sorted({a for e in entries for a in e["arches"]}) or ["cpu"])
    cache = build_mod._writable_cache(cache_dir)
    remote_store = build_mod._remote_store(remote, log, build_mod._build_trust(opts, signer))
    cache.sweep_tmp()
    folders = [os.path.dirname(os.path.abspath(path)), os.getcwd()]
    sys.path[:0] = folders
    try:
        sources, stale = load_entries(entries, opts, log)
    finally:
        for folder in folders:
            sys.path.remove(folder)
    if not sys.platform.startswith("linux"):
        jobs = 1  # workers are forked with the re-created entries; a new interpreter would not have them
    report = build_mod._build_sources(sources, [], arches, opts, cache, jobs, force, log, out, verbose,
                                      skip_unexpressible, shard, remote_store, signer)
    report.stale = stale
    report.seconds = time.perf_counter() - t0
    build_mod.print_summary(report, arches, out, show_timings)
    return report
