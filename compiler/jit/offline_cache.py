"""Compiled kernels through the offline cache (runtime/cache.py): direct mode obtains each
kernel variant from it, or compiles and stores it there; `qdc build` stores what it builds
(compiler/commands/build.py). An offline process (`offline=True`) only obtains: from the cache,
else from the remote store of QDC_REMOTE, else KernelNotPrebuiltError. Every variant obtained
is noted in the kernel manifest when one is being recorded (compiler/manifest/recording.py).

With trusted keys (qd.init(trusted_keys=...) or $QDC_TRUSTED_KEYS), an entry is used only if
a trusted key signed it (runtime/signing.py); any other is refused with a CacheError, never
recompiled over. A kernel compiled here is then stored only if $QDC_SIGNING_KEY can sign it
(it would be refused next time); that key signs whatever this process stores.

This is the top floor, with the kernel objects: like a deployment it uses the runtime (the
cache folder's reader and writer), while the compiler below it takes from the runtime only
runtime/contract/ (tests/architecture/test_contract_boundary.py).
"""
from __future__ import annotations

import os
import time
import warnings

from qdc.runtime import signing
from qdc.runtime.cache import Cache, check_cache_folder, writable_problem
from qdc.runtime.contract.errors import CacheError, KernelNotPrebuiltError, SignatureError

from ..driver import cache_key, kernel as compiling, source_facts
from ..driver.kernel import CompiledKernel, compile_recording_warnings, replay_warnings
from ..driver.sources import collection_paused
from ..manifest import recording

# Artifacts kept in memory but not written to the cache (textual LLVM IR: `qdc inspect --llvm`
# disassembles the stored bitcode instead).
_NOT_STORED = frozenset({"ll"})

_CACHES: dict = {}      # cache folder -> Cache
_UNWRITABLE: set = set()  # cache folders we failed to write (warned once)
_TRUST: dict = {}       # the settings -> (Trust or None, SigningKey or None)


def cache_for(opts) -> Cache:
    root = opts.resolved_cache_dir
    cache = _CACHES.get(root)
    if cache is None:
        cache = _CACHES[root] = Cache(root)
    return cache


def trust_for(opts) -> tuple:
    """(Trust or None, SigningKey or None) of direct mode's options and environment."""
    variables = (signing.TRUSTED_KEYS_VARIABLE, signing.REVOKED_KEYS_VARIABLE, signing.SIGNING_KEY_VARIABLE)
    settings = (repr(opts.trusted_keys), repr(opts.revoked_keys), *(os.environ.get(v) for v in variables))
    if settings not in _TRUST:
        _TRUST[settings] = (signing.trust_from(opts.trusted_keys, opts.revoked_keys), signing.signing_key_from())
    return _TRUST[settings]


def check_cache_dir(opts) -> None:
    """At `qd.init`: ValueError if cache_dir is a file or a trusted key cannot be read; if the
    cache is not writable (a read-only deployment, say), one warning now, and kernels are
    compiled without being stored (its entries are still used). What parsing the kernels'
    sources found is kept there too, unless trusted keys guard the cache (source_facts.py)."""
    trust, _ = trust_for(opts)
    root = check_cache_folder(opts.resolved_cache_dir, "cache_dir")
    source_facts.keep_in(None if trust is not None else os.path.join(root, source_facts.FOLDER))
    problem = writable_problem(root)
    if problem is None:
        _UNWRITABLE.discard(cache_for(opts).root)
        return
    _UNWRITABLE.add(cache_for(opts).root)
    warnings.warn(f"qdc: cache_dir {root} is not writable ({problem}): kernels it does not hold yet will be "
                  f"compiled on every run. Set qd.init(cache_dir=...) to a writable folder.", stacklevel=3)


class Counts:
    """Kernel variants this process compiled and took from the cache (tests count compiles)."""
    compiled = 0
    from_cache = 0


def obtain(fn, params, opts, arch: str, variant: str = "forward", templates=None) -> CompiledKernel:
    """The kernel variant from the cache when its key hits, else compiled and stored. Offline
    (`opts.offline`): from the cache or the remote store, else KernelNotPrebuiltError.
    The cyclic garbage collector is held off while the key is computed and an entry loaded
    (not while compiling): both allocate many short-lived objects, and in a program of a
    million live objects the full collections they would trigger cost more than they do."""
    cache = cache_for(opts)
    try:
        with collection_paused():
            deps = cache_key.kernel_key(fn, params, opts, arch, variant, templates)
    except cache_key.UncacheableKernel as e:  # compiled, never stored: better than a shared entry
        if opts.offline:
            raise _not_prebuilt(fn, params, arch, variant, templates, f"it cannot be looked up: {e}") from None
        _uncacheable(fn, variant, e)
        compiled = compiling.compile_kernel(fn, params, opts, arch, variant=variant, templates=templates)
        Counts.compiled += 1
        recording.note(fn, params, opts, arch, variant, templates, uncacheable=str(e))
        return compiled
    trust, signer = trust_for(opts)
    with collection_paused():
        hit = load_cached(cache, deps, trust)
    if hit is None and opts.offline and _fetched(cache, deps.key, trust):
        hit = load_cached(cache, deps, trust)
    if hit is None and opts.offline:
        raise _not_prebuilt(fn, params, arch, variant, templates, f"neither the cache at {cache.root} nor "
                            f"{remote_url() or 'a remote store (QDC_REMOTE)'} holds it")
    recording.note(fn, params, opts, arch, variant, templates, module_reads=deps.module_reads)
    if hit is not None:
        Counts.from_cache += 1
        replay_warnings(hit.warnings, fn)
        return hit
    compiled = compile_recording_warnings(fn, params, opts, arch, variant, templates)
    Counts.compiled += 1
    compiled.deps = deps
    if trust is not None and signer is None:
        cache_key.log(f"kernel '{fn.__name__}' ({variant}) is compiled but not cached: trusted keys are configured "
                      f"and no signing key (${signing.SIGNING_KEY_VARIABLE}) signs what this process stores")
    elif store(cache, deps, compiled, fn, arch, variant, opts) and signer is not None:
        try:
            cache.sign_entry(deps.key, signer)
        except (OSError, CacheError) as e:
            warnings.warn(f"qdc: could not sign cache entry {deps.key[:12]}... ({e})", stacklevel=3)
    return compiled


_WARNED_UNDESCRIBABLE: set = set()


def _uncacheable(fn, variant: str, e: Exception) -> None:
    """A template argument that cannot be described is named once per kernel (it is compiled
    in every process); anything else the cache cannot key, under QDC_LOG=cache."""
    if isinstance(e, cache_key.UndescribableTemplate) and fn not in _WARNED_UNDESCRIBABLE:
        _WARNED_UNDESCRIBABLE.add(fn)
        warnings.warn(f"qdc: {e}: kernel '{fn.__name__}' is compiled in every process (never cached) and "
                      f"cannot be built ahead of time; pass a config object of numbers, strings, dtypes, "
                      f"tuples, fields and ndarrays", stacklevel=5)
    cache_key.log(f"kernel '{fn.__name__}' ({variant}) is compiled but not cached: {e}")


def _not_prebuilt(fn, params, arch, variant, templates, why: str) -> KernelNotPrebuiltError:
    kernel = f"{recording.module_name(fn)}.{fn.__qualname__}"
    instantiation = recording.instantiation_text(params, variant, arch, templates)
    return KernelNotPrebuiltError(f"kernel '{kernel}' {instantiation} is not prebuilt and this process is offline "
                                  f"(offline=True / QDC_OFFLINE=1: it never compiles): {why}. Record the program "
                                  f"(qdc record -o kernels.manifest -- python ...) and build the manifest (qdc "
                                  f"build --manifest kernels.manifest) into this cache", kernel, instantiation)


_REMOTES: dict = {}


def remote_url() -> str | None:
    from qdc.runtime.remote import REMOTE_VARIABLE
    return os.environ.get(REMOTE_VARIABLE) or None


def _fetched(cache: Cache, key: str, trust=None) -> bool:
    """Whether entry `key` was fetched (verified; with `trust`, its signature too) from the remote
    store of QDC_REMOTE into `cache`."""
    url = remote_url()
    if url is None:
        return False
    from qdc.runtime import remote as remote_mod
    try:
        store = _REMOTES.get(url) or _REMOTES.setdefault(url, remote_mod.RemoteStore(url))
        return remote_mod.fetch_entry(store, cache, key, trust)
    except SignatureError:
        raise  # refused, as a cache entry is
    except (ImportError, CacheError) as e:
        warnings.warn(f"qdc: the remote store {url} cannot be read ({e})", stacklevel=5)
        return False


def load_cached(cache: Cache, deps, trust=None) -> CompiledKernel | None:
    try:
        entry = cache.lookup(deps.key, trust)
    except SignatureError:
        raise  # refused, never replaced: whoever could write it there must not win by it
    except CacheError as e:
        warnings.warn(f"qdc: discarding a corrupt cache entry and recompiling: {e}", stacklevel=4)
        cache.evict(deps.key)
        return None
    if entry is None:
        return None
    try:
        fields = deps.bind(entry.field_refs)
        stale = any(f.dtype.name != fm.dtype or tuple(f.storage_shape) != tuple(fm.shape)
                    for f, fm in zip(fields, entry.meta.fields))
    except IndexError:
        stale = True
    if stale:  # the entry does not fit these fields: evict it so the recompiled one takes its place
        cache.evict(deps.key)
        return None
    hit = CompiledKernel(None, entry.meta, entry.artifacts, fields, deps, from_cache=True)
    hit.warnings = entry.record.get("warnings", [])
    return hit


def store(cache: Cache, deps, compiled: CompiledKernel, fn, arch: str, variant: str, opts,
          replace: bool = False, raise_errors: bool = False) -> bool:
    """Write the entry (False if the kernel cannot be cached or the cache is not writable).
    `raise_errors` (`qdc build`): a failed write raises its OSError instead of warning."""
    refs = deps.refs_for(compiled.field_objects)
    if refs is None:
        cache_key.log(f"kernel '{fn.__name__}' ({variant}) is compiled but not cached: it reaches a field "
                      f"through an expression the cache key does not follow")
    if refs is None or (cache.root in _UNWRITABLE and not raise_errors):
        return False
    code = fn.__code__
    body = {"kernel": fn.__name__, "variant": variant, "arch": arch, "compiler": cache_key.compiler_version(arch),
            "created": time.time(), "source": f"{code.co_filename}:{code.co_firstlineno}",
            "options": opts.key(), "meta": compiled.meta.to_dict(), "field_refs": refs,
            "warnings": compiled.warnings}
    artifacts = {k: v for k, v in compiled.artifacts.items() if isinstance(v, bytes) and k not in _NOT_STORED}
    try:
        cache.write_entry(deps.key, body, artifacts, replace=replace)
    except OSError as e:
        if raise_errors:
            raise
        _UNWRITABLE.add(cache.root)
        warnings.warn(f"qdc: cannot write the offline cache at {cache.root} ({e}); kernels will be compiled "
                      f"on every run. Set qd.init(cache_dir=...) to a writable folder.", stacklevel=4)
        return False
    return True
