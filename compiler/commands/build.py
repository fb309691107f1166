"""`qdc build`: compile kernel modules ahead of time into the offline cache.

Each kernel file is imported (its fields are named after the globals they are bound to,
first binding in sorted file order wins), every `@qd.kernel` it defines gets a cache key
per arch, hits are skipped and misses compiled — in this process, or with `-j N` in N
worker processes fed one job at a time over a pipe (JSON lines; nothing is pickled). A
module record listing the module's fields and kernel entries is written once all of its
kernels are built; a module with a failed kernel keeps its previous record. With `--arch all`
a kernel an arch cannot express (targets.base.TargetCannotExpress: f64 on Metal) is skipped
for that arch: the record lists it under "skipped" with the reason, which loading reports.
With a signing key (`--sign`), every entry of the build (compiled, cached or pulled) and every
module record it writes is signed (runtime/signing.py); entries are then pulled from a remote
only if that key, or a trusted one, signed them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import sys
import threading
import time
import traceback

from qdc.runtime.contract import arches
from qdc.runtime.contract.artifact_schema import VARIANT_SUFFIXES, VARIANTS
from qdc.runtime.cache import Cache, check_cache_folder, writable_problem
from qdc.runtime.contract.errors import QdcCompileError
from qdc.runtime.contract.objects import FieldMarker as Field, StructFieldMarker as StructField
from qdc.runtime.contract.python_scope import scope_types
from qdc.runtime import remote as remote_mod, signing

from ..driver import cache_key, options as options_mod, source_facts
from .. import targets, timings
from ..compile_threads import limited_threads, threads_beside
from ..jit.aot import Instantiation
from ..jit.kernel import Kernel, kernel_of
from ..jit.offline_cache import store
from ..targets.base import TargetCannotExpress
from ..driver.kernel import compile_recording_warnings, dual_params, warm_up
from .build_workers import forked_workers, run_in_workers

# A worker process takes about as long to start (imports, llvmlite) as compiling a few
# kernels: below this many misses, `-j` builds in this process alone.
MIN_JOBS_FOR_WORKERS = 4


class BuildUsageError(ValueError):
    """Bad paths or arches given to `qdc build` (the CLI exits 2)."""


# ---- finding and importing kernel modules ---------------------------------------------------

def discover(paths) -> list[str]:
    """Every .py file named, or found under a named folder, sorted; BuildUsageError if none."""
    files = []
    for p in paths:
        if os.path.isfile(p):
            if not p.endswith(".py"):
                raise BuildUsageError(f"{p}: not a Python file")
            files.append(os.path.abspath(p))
        elif os.path.isdir(p):
            for dirpath, dirs, names in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
                files += [os.path.abspath(os.path.join(dirpath, n)) for n in names
                          if n.endswith(".py") and not n.startswith(".")]
        else:
            raise BuildUsageError(f"{p}: no such file or folder")
    if not files:
        raise BuildUsageError(f"no .py files in {', '.join(map(str, paths))}")
    return sorted(dict.fromkeys(files))


@dataclasses.dataclass
class ModuleSource:
    path: str
    name: str
    module: object = None
    kernels: dict = dataclasses.field(default_factory=dict)  # global name -> Kernel defined here
    fields: dict = dataclasses.field(default_factory=dict)   # global name -> Field
    reached: list = dataclasses.field(default_factory=list)  # fields its kernels reach (any module)
    structs: dict = dataclasses.field(default_factory=dict)  # global name -> struct field (its members are fields)
    error: str | None = None


def load_sources(files: list[str], opts) -> list[ModuleSource]:
    """Import every file and name fields after their globals, identically in every process.
    The imports run in an import context of `opts`' default types (runtime/contract/
    python_scope.py): a module-level `qd.field(float, ...)` takes the build's default_fp, not
    direct mode's, and the context ends with the imports."""
    with scope_types.importing(opts.default_ip, opts.default_fp):
        return _load_sources(files)


def _load_sources(files: list[str]) -> list[ModuleSource]:
    sources, stems, named = [], {}, set()
    for path in files:
        stem = os.path.splitext(os.path.basename(path))[0]
        src = ModuleSource(path, stem)
        sources.append(src)
        if stem in stems:
            src.error = f"{path}: error: module name '{stem}' is also used by {stems[stem]}; rename one file"
            continue
        stems[stem] = path
        try:
            src.module = _import_file(path, stem)
        except Exception as e:  # noqa: BLE001  (any failure of user code at import time)
            src.error = _import_error(path, e)
            continue
        for name, value in vars(src.module).items():
            if isinstance(value, Field) and not value.is_grad:
                if id(value) not in named:
                    value.set_name(name)
                    named.add(id(value))
                src.fields.setdefault(value.name, value)
            elif isinstance(value, StructField) and not value.is_grad:
                if id(value) not in named:
                    value.set_name(name)  # and its members <name>__<member>
                    named.add(id(value))
                src.structs.setdefault(value.name, value)
                for _, leaf in value.leaves():
                    src.fields.setdefault(leaf.name, leaf)
            elif (kernel := kernel_of(value)) is not None and kernel.fn.__module__ == src.module.__name__ \
                    and not _has_templates(kernel):  # built only as the instantiations a module declares
                src.kernels.setdefault(name, kernel)
            elif isinstance(value, Instantiation):  # `name = qd.aot.instantiate(kernel, ...)`
                src.kernels.setdefault(name, value)
    return sources


def _has_templates(kernel: Kernel) -> bool:
    """Template and dataclass parameters: built as the instantiations a module declares."""
    try:
        return kernel.template_params is not None or bool(kernel.dataclass_names)
    except QdcCompileError:  # a bad annotation: the kernel's job reports it
        return False


def _import_file(path: str, stem: str):
    existing = sys.modules.get(stem)
    if existing is not None and os.path.abspath(getattr(existing, "__file__", "") or "") == path:
        return existing  # already imported as a dependency of an earlier kernel module
    name = stem if existing is None else f"_qdc_build_{stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = os.path.dirname(path)
    sys.path.insert(0, folder)  # sibling imports (`from common import ...`) work as when run directly
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        sys.path.remove(folder)
    return module


def _import_error(path: str, e: Exception) -> str:
    if isinstance(e, SyntaxError) and e.filename:
        where = f"{e.filename}:{e.lineno or 0}:{e.offset or 0}"
        text = f"\n{e.text.rstrip()}" if e.text else ""
        return f"{where}: error: importing the module failed: SyntaxError: {e.msg}{text}"
    if isinstance(e, QdcCompileError):
        return str(e)
    frames = [f for f in traceback.extract_tb(e.__traceback__) if os.path.abspath(f.filename) == path]
    where = f"{path}:{frames[-1].lineno}:1" if frames else path
    return f"{where}: error: importing the module failed: {type(e).__name__}: {e}"


# ---- jobs ------------------------------------------------------------------------------------

@dataclasses.dataclass
class Job:
    module: str
    kernel: str          # the global name the module binds it to
    variant: str
    arch: str


def _options_for(opts, arch):
    """The build's options for one arch: a target option left unset takes its `qdc build`
    default (prebuilt CPU code is portable unless told otherwise)."""
    out = opts.copy(arch=arch)
    for name, (_, option) in options_mod.target_options().items():
        if getattr(out, name) is None and option.build_default is not None:
            setattr(out, name, option.build_default)
    return out


def _params_for_aot(kernel: Kernel, opts):
    params = [p for p in kernel.params_for(opts) if p.kind != "dataclass"]  # instantiated: their members
    for p in params:
        if p.kind == "ndarray" and (p.dtype is None or p.ndim is None or None in p.element_shape):
            code = kernel.fn.__code__
            raise QdcCompileError(f"ndarray parameter '{p.name}' of kernel '{kernel.__name__}' needs dtype= and "
                                  f"ndim= (and an element_dim's element_shape=) in its annotation to be built "
                                  f"ahead of time", code.co_filename,
                                  code.co_firstlineno, 1)
    return params


def _variant_params(params: list, variant: str) -> list:
    """The forward_ad variant is built without ndarray duals: there is no argument to follow."""
    return dual_params((), None, (), params)[1] if variant == "forward_ad" else params


def _templates_of(kernel):
    """The bound template arguments of an instantiation (`qd.aot.instantiate`), else None."""
    return kernel.build_templates() if isinstance(kernel, Instantiation) else None


def _job_options(kernel, opts, arch: str):
    """The options a kernel is built with for `arch`: a manifest entry's own code options over
    the build's (compiler/commands/build_manifest.py, ManifestKernel)."""
    own = getattr(kernel, "options_over", None)
    return _options_for(own(opts) if own is not None else opts, arch)


def _job_params(kernel, opts, variant: str) -> list:
    """The parameters of `variant` as built: a manifest entry's as they were recorded, else the
    annotations' (`_params_for_aot`)."""
    recorded = getattr(kernel, "recorded_params", None)
    if recorded is not None:
        return recorded(opts)
    return _variant_params(_params_for_aot(kernel, opts), variant)


def run_job(src: ModuleSource, job: Job, opts, cache: Cache, force: bool) -> dict:
    """Compile one kernel variant and store it: {"status": "built"|"failed", "key", "error", "seconds"}."""
    t0 = time.perf_counter()
    kernel = src.kernels[job.kernel]
    spent = timings.KernelTimings()
    try:
        with timings.recording(spent):
            with timings.phase("cache key"):
                arch_opts = _job_options(kernel, opts, job.arch)
                params = _job_params(kernel, arch_opts, job.variant)
                templates = _templates_of(kernel)
                deps = cache_key.kernel_key(kernel.fn, params, arch_opts, job.arch, job.variant, templates)
        compiled = compile_recording_warnings(kernel.fn, params, arch_opts, job.arch, job.variant, templates)
        if not getattr(kernel, "serves_direct_mode", False):  # a manifest entry's process reads them itself
            _check_members_buildable(compiled.meta)
        for name, (wall, cpu) in compiled.timings.phases.items():
            spent.add(name, wall, cpu)
        with timings.recording(spent), timings.phase("cache write"):
            try:
                stored = store(cache, deps, compiled, kernel.fn, job.arch, job.variant, arch_opts, replace=force,
                               raise_errors=True)
            except OSError as e:
                raise CacheWriteError(f"cannot write its cache entry in {cache.root}: {e.strerror or e}") from None
        if not stored:
            raise RuntimeError("the kernel reaches a field through an expression the cache key cannot follow "
                               "(bind the field to a module-level name)")
        return {"status": "built", "key": deps.key, "seconds": time.perf_counter() - t0,
                "timings": spent.to_wire()}
    except TargetCannotExpress as e:  # skipped by `--arch all`, a failure otherwise (`_Outcome`)
        return {"status": CANNOT_EXPRESS, "error": str(e), "reason": f"{e.filename}:{e.line}:{e.col}: {e.raw_message}"}
    except Exception as e:  # noqa: BLE001  (reported per kernel; the build goes on)
        return {"status": "failed", "error": _job_error(src, job, e)}


def _check_members_buildable(meta) -> None:
    """A built kernel reads members only off its own arguments: an array inside a template
    argument exists only in the building process."""
    for name, path in meta.members.items():
        if path[0] not in (meta.signature or ()):
            raise RuntimeError(f"it reads the array {'.'.join(map(str, path))} inside template argument "
                               f"'{path[0]}', which a built kernel cannot take: pass the array as an ndarray "
                               f"parameter (or inside a dataclass parameter) to build it ahead of time")


CANNOT_EXPRESS = "cannot_express"  # a job's status before the build decides: skipped or failed


class CacheWriteError(Exception):
    """A compiled kernel could not be stored (a full disk, say): reported as it is, not as a kernel fault."""


def _job_error(src: ModuleSource, job: Job, e: Exception) -> str:
    if isinstance(e, QdcCompileError):
        return str(e)
    if isinstance(e, CacheWriteError):
        return f"{src.path}: error: kernel '{job.kernel}' ({job.arch}): {e}"
    return f"{src.path}: error: kernel '{job.kernel}' ({job.arch}): {type(e).__name__}: {e}"


# ---- the build -------------------------------------------------------------------------------

@dataclasses.dataclass
class BuildReport:
    built: int = 0
    cached: int = 0
    skipped: int = 0      # kernel variants the target cannot express (`--arch all` only)
    pulled: int = 0       # cache misses fetched from the remote store instead of compiled
    elsewhere: int = 0    # kernel variants of the other shards (`--shard K/N`)
    failed: int = 0
    kernels: int = 0      # forward variants among those (built, cached or failed)
    gradients: int = 0    # reverse-mode variants among those
    forward_modes: int = 0  # forward-mode (forward_ad) variants among those
    modules: int = 0
    seconds: float = 0.0
    errors: list = dataclasses.field(default_factory=list)
    stale: list = dataclasses.field(default_factory=list)  # manifest entries the program no longer matches
    # (kernel variant, arch, compiler/timings.KernelTimings) of each variant compiled
    timings: list = dataclasses.field(default_factory=list)
    start_up: tuple = (0.0, 0.0)  # (wall, CPU) seconds of setting up the compiler, before any kernel

    @property
    def ok(self) -> bool:
        return self.failed == 0 and not self.errors and not self.stale


def means_every_arch(spec) -> bool:
    """Whether an --arch value is `all` (as resolve_arches reads it)."""
    items = spec if isinstance(spec, (list, tuple)) else str(spec).split(",")
    return [str(a).strip() for a in items if str(a).strip()] == ["all"]


def resolve_arches(spec) -> list[str]:
    if means_every_arch(spec):
        return list(targets.available())
    items = spec if isinstance(spec, (list, tuple)) else str(spec).split(",")
    items = [str(a).strip() for a in items if str(a).strip()]
    for a in items:
        if a not in arches.names():
            raise BuildUsageError(f"unknown arch '{a}' (choose from {', '.join(arches.names())} or all)")
        if a not in targets.available():
            raise BuildUsageError(f"arch '{a}' has no code generator in this build of qdc "
                                  f"(available: {', '.join(targets.available())})")
    if not items:
        raise BuildUsageError("no arch given")
    return list(dict.fromkeys(items))


def parse_shard(text) -> tuple[int, int] | None:
    """'K/N' (1 <= K <= N) -> (K, N); None for None; BuildUsageError otherwise."""
    if text is None:
        return None
    k, _, n = str(text).partition("/")
    try:
        k, n = int(k), int(n)
    except ValueError:
        k = n = 0
    if not 1 <= k <= n:
        raise BuildUsageError(f"invalid shard '{text}': use K/N with 1 <= K <= N, e.g. --shard 2/4")
    return k, n


def shard_units(units: list[tuple], shard: tuple[int, int] | None) -> set:
    """The units (module, kernel, arch) that shard K of N builds: all units sorted by a stable
    hash of their names and dealt out in turn, so shards differ in size by one at most and a
    kernel's variants (its gradient too) stay together."""
    if shard is None:
        return set(units)
    k, n = shard
    ordered = sorted(set(units), key=lambda u: hashlib.sha256("/".join(u).encode()).hexdigest())
    return set(ordered[k - 1::n])


def build(paths, arches, opts, cache_dir: str, jobs: int = 1, force: bool = False,
          log=None, out=None, verbose: bool = False, skip_unexpressible: bool = False,
          shard: tuple[int, int] | None = None, remote: str | None = None,
          show_timings: bool = False, signer: signing.SigningKey | None = None) -> BuildReport:
    """Build every kernel under `paths` for `arches` into `cache_dir`. `log(text)` gets errors
    (default: stderr); `out(text)` a numbered line per kernel variant compiled (`verbose`: a
    line per cache hit too) and the summary (default: stdout). `skip_unexpressible` (`--arch
    all`): a kernel variant an arch cannot express (TargetCannotExpress) is skipped for that
    arch, with its reason in the module record, instead of failing the build. `shard` (K, N):
    build only shard K's kernels (`shard_units`); the module records name every kernel's entry
    and are complete once the shards' caches are merged. `remote`: a store URL (runtime/remote.py)
    where misses are looked up before compiling and where built entries, then complete module
    records, are uploaded. `show_timings` (`--timings`): before the summary, where each kernel
    variant compiled spent its time, per phase (compiler/timings.py), largest first. `signer`: the
    key that signs every entry and module record of the build."""
    log = log or (lambda text: print(text, file=sys.stderr, flush=True))
    out = out or (lambda text: print(text, flush=True))
    t0 = time.perf_counter()
    files = discover(paths)
    cache = _writable_cache(cache_dir)
    remote_store = _remote_store(remote, log, _build_trust(opts, signer))
    cache.sweep_tmp()  # staging folders of killed builds, once stale
    imported_before = set(sys.modules)
    try:
        sources = load_sources(files, opts)
        report = _build_sources(sources, files, arches, opts, cache, jobs, force, log, out, verbose,
                                skip_unexpressible, shard, remote_store, signer)
    finally:
        _forget_modules(imported_before, files)  # a later build in this process imports afresh
    report.seconds = time.perf_counter() - t0
    print_summary(report, arches, out, show_timings)
    return report


def _remote_store(url, log, trust=None):
    if url is None:
        return None
    try:
        store = remote_mod.RemoteStore(url)
    except (ImportError, remote_mod.CacheError) as e:
        raise BuildUsageError(str(e)) from None
    store.log, store.trust = log, trust
    return store


def _build_trust(opts, signer):
    """Whose signatures make a remote's entry good enough to pull: the trusted keys, and the
    build's own key (a signing build never signs what a stranger wrote)."""
    try:
        trust = signing.trust_from(opts.trusted_keys, opts.revoked_keys)
    except (ImportError, ValueError) as e:
        raise BuildUsageError(str(e)) from None
    if signer is None:
        return trust
    return trust.with_key(signer.public) if trust is not None else signing.Trust([signer.public], set())


def _writable_cache(cache_dir: str) -> Cache:
    """The cache to build into; BuildUsageError if it is a file or cannot be written (tried for
    real: a read-only cache would otherwise fail every kernel, one by one). What parsing the
    kernels' sources finds is kept there too (source_facts.py): a process run from that cache
    parses nothing."""
    try:
        root = check_cache_folder(cache_dir)
    except ValueError as e:
        raise BuildUsageError(str(e)) from None
    problem = writable_problem(root)
    if problem is not None:
        raise BuildUsageError(f"cache folder '{cache_dir}' is not writable ({problem}): build into a writable "
                              f"folder (--cache DIR)")
    source_facts.keep_in(os.path.join(root, source_facts.FOLDER))
    return Cache(root)


def _forget_modules(imported_before: set, files: list[str]) -> None:
    folders = {os.path.dirname(f) for f in files}
    for name in set(sys.modules) - imported_before:
        path = getattr(sys.modules[name], "__file__", None)
        if path and os.path.dirname(os.path.abspath(path)) in folders:
            del sys.modules[name]


def _build_sources(sources, files, arches, opts, cache: Cache, jobs: int, force: bool, log, out,
                   verbose: bool, skip_unexpressible: bool = False, shard=None, remote=None,
                   signer=None) -> BuildReport:
    report = BuildReport()
    todo, results = [], {}
    by_name = {s.name: s for s in sources if s.error is None}
    mine = shard_units([(s.name, k, a) for s in by_name.values() for k in s.kernels for a in arches], shard)
    for src in sources:
        if src.error is not None:
            report.errors.append(src.error)
            log(src.error)
            continue
        todo += _plan(src, arches, opts, cache, force, results, mine, remote)
    report.cached = sum(1 for r in results.values() if r["status"] in ("cached", "pulled"))
    report.pulled = sum(1 for r in results.values() if r["status"] == "pulled")
    report.elsewhere = sum(1 for r in results.values() if r["status"] == "elsewhere")
    if verbose:
        for (module, kernel, variant, arch) in results:
            out(f"cached {_variant_name(module, kernel, variant)} ({arch})")
    progress = _Progress(len(todo), out, log)

    def finished(job: Job, result: dict):
        if result["status"] == CANNOT_EXPRESS:
            result = {**result, "status": "skipped" if skip_unexpressible else "failed"}
        results[_job_id(job)] = result
        if "timings" in result:
            report.timings.append((_variant_name(job.module, job.kernel, job.variant), job.arch,
                                   timings.KernelTimings(result["timings"])))
        progress.step(job, result)

    def here(job: Job) -> dict:
        return run_job(by_name[job.module], job, opts, cache, force)

    if todo:
        t0, c0 = time.perf_counter(), time.process_time()
        warm_up(sorted({job.arch for job in todo}))
        report.start_up = (time.perf_counter() - t0, time.process_time() - c0)
    in_workers = jobs > 1 and len(todo) >= MIN_JOBS_FOR_WORKERS
    # The compiling processes share the cores among their threads; -j 1 builds on one thread.
    with limited_threads(1 if jobs == 1 else threads_beside(min(jobs, len(todo)) if in_workers else 1)):
        if in_workers:
            workers = min(jobs, len(todo)) - 1
            hello = {"files": files, "options": _options_wire(opts), "cache": cache.root, "force": force}
            run_in_workers(todo, hello, workers, finished, here,
                           forked_workers(_job_server(by_name, opts, cache, force), workers))
        else:
            for job in todo:
                finished(job, here(job))
    _tally(report, todo, results)
    for job_id, result in results.items():
        if result["status"] == "elsewhere":
            continue
        if job_id[2] == "grad":
            report.gradients += 1
        elif job_id[2] == "forward_ad":
            report.forward_modes += 1
        else:
            report.kernels += 1
    if signer is not None:
        _sign_entries(cache, results, signer, report, log)
    for src in by_name.values():
        if src.kernels or src.fields:
            report.modules += 1
            for arch in arches:
                _write_module_record(cache, src, arch, results, report, log, signer)
    if remote is not None:
        problem = _push(remote, cache, by_name, arches, results, log)
        if problem is not None:  # the local build stands; the run fails, so that CI notices
            report.errors.append(problem)
    return report


def _push(remote, cache: Cache, by_name: dict, arches, results: dict, log) -> str | None:
    """Upload this build's entries, then each module record whose entries are all on the remote
    (runtime/remote.py, push_module). Checking after one's own upload makes the last shard to
    finish upload every record. The error, if an upload failed (a remote that refuses writes
    is a warning: it still serves reads)."""
    keys = sorted({r["key"] for r in results.values() if r["status"] in ("built", "cached")})
    try:
        for key in keys:
            remote_mod.push_entry(remote, cache, key)
        for src in by_name.values():
            for arch in arches:
                if not os.path.isfile(cache.path(remote_mod.module_path(src.name, arch))):
                    continue
                remote_mod.push_module(remote, cache, src.name, arch)  # if the other shards' entries are there
        remote_mod.push_source_records(remote, cache)  # what parsing found, for `qdc pull` to fetch
    except remote_mod.RemoteWriteRefused as e:
        remote_mod.refused(remote, e, log)
    except remote_mod.CacheError as e:
        problem = f"qdc build: error: uploading to {remote.url}: {e}"
        log(problem)
        return problem
    return None


def _job_id(job: Job) -> tuple:
    return (job.module, job.kernel, job.variant, job.arch)


def _plan(src: ModuleSource, arches, opts, cache: Cache, force: bool, results: dict, mine=None,
          remote=None) -> list[Job]:
    """Jobs for the kernels of `src` that are not already cached (locally, else on `remote`, which
    then installs them locally) and belong to this shard (`mine`); the others go straight to
    `results` (another shard's as "elsewhere", with their keys for the module record)."""
    todo = []
    for name, kernel in src.kernels.items():
        for arch in arches:
            keys, fields = _variant_keys(kernel, _job_options(kernel, opts, arch), arch)
            src.reached += fields
            for variant in keys or ["forward"]:
                job = Job(src.name, name, variant, arch)
                if mine is not None and (src.name, name, arch) not in mine:
                    if keys:
                        results[_job_id(job)] = {"status": "elsewhere", "key": keys[variant]}
                elif keys and not force and cache.has_entry(keys[variant]):
                    results[_job_id(job)] = {"status": "cached", "key": keys[variant]}
                elif keys and not force and _pulled(remote, cache, keys[variant]):
                    results[_job_id(job)] = {"status": "pulled", "key": keys[variant]}
                else:
                    todo.append(job)
    return todo


def _pulled(remote, cache: Cache, key: str) -> bool:
    """Whether entry `key` was fetched from `remote` (verified) into `cache`. A remote that
    cannot be reached, or holds a bad copy, is reported and the kernel compiled instead."""
    if remote is None:
        return False
    try:
        return remote_mod.fetch_entry(remote, cache, key, remote.trust)
    except remote_mod.CacheError as e:
        remote.log(f"qdc build: warning: {e} (compiling it instead)")
        return False


def _variant_keys(kernel: Kernel, opts, arch: str) -> tuple[dict, list]:
    """({variant: cache key}, fields the kernel can reach): the reverse-mode variant too when
    the kernel touches needs_grad data. Empty if the key cannot be computed: the job then
    compiles and reports the real error."""
    try:
        templates = _templates_of(kernel)
        variant = getattr(kernel, "variant", None)
        if variant is not None:  # a manifest entry: exactly the variant it names
            deps = cache_key.kernel_key(kernel.fn, _job_params(kernel, opts, variant), opts, arch, variant, templates)
            return {variant: deps.key}, deps.fields
        params = _params_for_aot(kernel, opts)
        deps = cache_key.kernel_key(kernel.fn, params, opts, arch, "forward", templates)
        keys = {"forward": deps.key}
        if deps.needs_grad:
            keys["grad"] = cache_key.kernel_key(kernel.fn, params, opts, arch, "grad", templates).key
        if deps.needs_dual:  # forward mode (qd.ad.FwdMode) through a field with needs_dual
            keys["forward_ad"] = cache_key.kernel_key(kernel.fn, _variant_params(params, "forward_ad"), opts, arch,
                                                      "forward_ad", templates).key
        return keys, deps.fields
    except Exception:  # noqa: BLE001
        return {}, []


def _tally(report: BuildReport, todo: list[Job], results: dict) -> None:
    for job in todo:
        r = results.get(_job_id(job)) or {"status": "failed", "error": f"kernel '{job.kernel}': no result"}
        if r["status"] == "built":
            report.built += 1
        elif r["status"] == "skipped":
            report.skipped += 1
        else:
            report.failed += 1


def _sign_entries(cache: Cache, results: dict, signer, report, log) -> None:
    """Sign every entry this build compiled, found cached or pulled (not other shards')."""
    for key in sorted({r["key"] for r in results.values() if r["status"] in ("built", "cached", "pulled")}):
        try:
            cache.sign_entry(key, signer)
        except (OSError, remote_mod.CacheError) as e:
            report.errors.append(f"qdc build: error: cannot sign entry {key[:12]}...: {e}")
            log(report.errors[-1])


def _write_module_record(cache: Cache, src: ModuleSource, arch: str, results: dict, report, log,
                         signer=None) -> None:
    kernels, skipped = {}, {}
    for name in src.kernels:
        for variant in VARIANTS:
            r = results.get((src.name, name, variant, arch))
            if r is None:
                continue
            if r["status"] == "skipped":  # loading says why it is missing (runtime/loader.py)
                skipped[name + VARIANT_SUFFIXES.get(variant, "")] = r["reason"]
                continue
            if r["status"] not in ("built", "cached", "pulled", "elsewhere"):
                return  # a failed kernel: keep the module's previous record, if any
            kernels[name + VARIANT_SUFFIXES.get(variant, "")] = r["key"]
    fields = _module_fields(src)
    if isinstance(fields, str):
        report.errors.append(fields)
        log(fields)
        return
    record = {"source": src.path, "fields": fields, "kernels": kernels,
              "compiler": cache_key.compiler_version(arch), "built": time.time()}
    element_shapes = {f.name: list(f.element_shape) for f in _declared_fields(src) if f.element_shape}
    if element_shapes:  # fields of vectors/matrices; absent otherwise, as in records from before them
        record["element_shapes"] = element_shapes
    if src.structs:  # struct name -> {member: its field's name, or a nested struct's record}
        record["struct_fields"] = {name: _struct_record(sf) for name, sf in src.structs.items()}
    if skipped:  # kernel variant name -> why the arch cannot express it; absent otherwise
        record["skipped"] = skipped
    cache.write_module(src.name, arch, record, signer)


def _struct_record(sf) -> dict:
    return {m: _struct_record(f) if isinstance(f, StructField) else f.name for m, f in sf.members.items()}


def _module_fields(src: ModuleSource):
    """The module's fields as records: its own globals, and fields of other modules its kernels
    reach (loading binds kernels to fields by name). An error string if two share a name."""
    out, seen = [], {}
    for f in [*src.fields.values(), *(f for f in src.reached if not f.is_grad)]:
        if f.name in seen and seen[f.name] is not f:
            return f"{src.path}: error: two different fields are named '{f.name}'"
        if not f.name.isidentifier():
            return f"{src.path}: error: field name '{f.name}' is not a Python identifier"
        seen[f.name] = f
    for f in seen.values():
        # needs_dual only where set: a module without duals keeps the 4-wide records of before
        dual = [True] if getattr(f, "needs_dual", False) else []
        out.append([f.name, f.dtype.name, list(f.storage_shape), bool(f.needs_grad)] + dual)
    return out


def _declared_fields(src: ModuleSource) -> list:
    return [*src.fields.values(), *(f for f in src.reached if not f.is_grad)]


def print_summary(report: BuildReport, arches, out, show_timings: bool = False) -> None:
    """The summary line, after (`show_timings`) where each kernel variant's time went."""
    if show_timings and report.timings:
        out(timings.table(report.timings))
        out(f"  start-up before the first kernel (imports, LLVM's targets): {1e3 * report.start_up[1]:.1f} ms CPU, "
            f"{1e3 * report.start_up[0]:.1f} ms wall")
    out(_summary(report, arches))


def _summary(report: BuildReport, arches) -> str:
    """'qdc build: 3 kernels + 1 gradient in 2 modules for cpu: 4 built, 0 cached, 0 failed in 1.20 s'
    ('4 built, 0 cached, 1 skipped (target cannot express them), 0 failed' when some were)."""
    what = _count(report.kernels, "kernel")
    if report.gradients:
        what += f" + {_count(report.gradients, 'gradient')}"
    if report.forward_modes:
        what += f" + {_count(report.forward_modes, 'forward-mode variant')}"
    parts = [f"{report.built} built", f"{report.cached} cached", f"{report.failed} failed"]
    if report.pulled:
        parts.insert(2, f"{report.pulled} of them pulled from the remote")
    if report.elsewhere:
        parts.append(f"{report.elsewhere} left to other shards")
    if report.skipped:
        parts.insert(2, f"{report.skipped} skipped (target cannot express them)")
    if report.errors:
        parts.append(_count(len(report.errors), "module error"))
    if report.stale:
        parts.append(_count(len(report.stale), "stale manifest entry").replace("entrys", "entries"))
    return (f"qdc build: {what} in {_count(report.modules, 'module')} for {', '.join(arches)}: "
            f"{', '.join(parts)} in {report.seconds:.2f} s")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _variant_name(module: str, kernel: str, variant: str) -> str:
    return f"{module}.{kernel}{VARIANT_SUFFIXES.get(variant, '')}"


class _Progress:
    """A numbered line per kernel variant compiled (`[3/15] built demo.compute.grad (cpu) in
    0.41 s`), which is also the progress of a long build; a failure's error goes to `log`."""

    def __init__(self, total: int, out, log):
        self.total, self.done, self.out, self.log = total, 0, out, log
        self.lock = threading.Lock()

    def step(self, job: Job, result: dict) -> None:
        with self.lock:
            self.done += 1
            if result["status"] == "failed":
                self.log(result["error"])
            took = f" in {result['seconds']:.2f} s" if "seconds" in result else ""
            if result["status"] == "skipped":
                took = f": {result['reason']}"
            self.out(f"[{self.done}/{self.total}] {result['status']} "
                     f"{_variant_name(job.module, job.kernel, job.variant)} ({job.arch}){took}")


# ---- worker processes (build_workers.py runs them) ----------------------------------------------

def _options_wire(opts) -> dict:
    return {name: (getattr(opts, name).name if hasattr(getattr(opts, name), "np_dtype") else getattr(opts, name))
            for name in options_mod.option_names()}


def _job_server(by_name: dict, opts, cache: Cache, force: bool):
    """What a forked worker runs: one job per line in, one result per line out."""
    def serve(jobs, results):
        for line in jobs:
            job = Job(**json.loads(line))
            results.write(json.dumps(run_job(by_name[job.module], job, opts, cache, force)) + "\n")
    return serve


def worker_main() -> None:
    """`python -m qdc.compiler.commands.build --worker`: first line = build setup, then one job per line."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # whatever user code prints goes to stderr, never into the protocol
    hello = json.loads(sys.stdin.readline())
    opts = options_mod.Options().update(**hello["options"])
    cache = Cache(hello["cache"])
    sources = {s.name: s for s in load_sources(hello["files"], opts)}
    for line in sys.stdin:
        job = Job(**json.loads(line))
        src = sources[job.module]
        if src.error is not None:
            result = {"status": "failed", "error": src.error}
        else:
            result = run_job(src, job, opts, cache, hello["force"])
        protocol.write(json.dumps(result) + "\n")


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    worker_main()
