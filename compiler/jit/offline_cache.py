"""Compiled kernels through the offline cache (runtime/cache.py): direct mode obtains each
kernel variant from it, or compiles and stores it there; `qdc build` stores what it builds
(compiler/driver/build.py).

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
from qdc.runtime.contract.errors import CacheError, SignatureError

from ..driver import cache_key, kernel as compiling
from ..driver.kernel import CompiledKernel, compile_recording_warnings, replay_warnings

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
    compiled without being stored (its entries are still used)."""
    trust_for(opts)
    root = check_cache_folder(opts.resolved_cache_dir, "cache_dir")
    problem = writable_problem(root)
    if problem is None:
        _UNWRITABLE.discard(cache_for(opts).root)
        return
    _UNWRITABLE.add(cache_for(opts).root)
    warnings.warn(f"qdc: cache_dir {root} is not writable ({problem}): kernels it does not hold yet will be "
                  f"compiled on every run. Set qd.init(cache_dir=...) to a writable folder.", stacklevel=3)


def obtain(fn, params, opts, arch: str, variant: str = "forward", templates=None) -> CompiledKernel:
    """The kernel variant from the cache when its key hits, else compiled and stored."""
    cache = cache_for(opts)
    try:
        deps = cache_key.kernel_key(fn, params, opts, arch, variant, templates)
    except cache_key.UncacheableKernel as e:  # compiled, never stored: better than a shared entry
        cache_key.log(f"kernel '{fn.__name__}' ({variant}) is compiled but not cached: {e}")
        # the front end explains why
        return compiling.compile_kernel(fn, params, opts, arch, variant=variant, templates=templates)
    trust, signer = trust_for(opts)
    hit = load_cached(cache, deps, trust)
    if hit is not None:
        replay_warnings(hit.warnings, fn)
        return hit
    compiled = compile_recording_warnings(fn, params, opts, arch, variant, templates)
    compiled.deps = deps
    if trust is not None and signer is None:
        cache_key.log(f"kernel '{fn.__name__}' ({variant}) is compiled but not cached: trusted keys are configured "
                      f"and no signing key (${signing.SIGNING_KEY_VARIABLE}) signs what this process stores")
    elif store(cache, deps, compiled, fn, arch, variant, opts) and signer is not None:
        try:
            cache.sign_entry(deps.key, signer)
        except (OSError, CacheError) as e:
            warnings.warn(f"qdc: could not sign cache entry {deps.key[:12]}… ({e})", stacklevel=3)
    return compiled



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
