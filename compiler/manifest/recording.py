"""Recording a kernel manifest while a program runs (`qdc record`, QDC_RECORD=FILE).

The offline cache notes each kernel variant it obtains, compiled or loaded
(compiler/jit/offline_cache.py, `obtain`); while QDC_RECORD names a file, `note` keeps one
manifest entry per variant: module and qualified name, variant, arch, the parameters as
compiled, the template arguments by value and the options that change code. At exit the
entries are merged into the file (manifest_file.merge_into: several processes of one program
may record into one file). A template argument that cannot be described, or described but not
re-created elsewhere (a lambda), is named in a warning and recorded with its problem, so that
building the manifest reports it instead of silently leaving it out.
"""
from __future__ import annotations

import atexit
import os
import sys
import warnings

from ..driver import options as options_mod
from ..driver import template_values
from . import manifest_file

RECORD_VARIABLE = "QDC_RECORD"

_entries: dict = {}        # identity -> entry, of this process
_registered_exit = False


_path_at_first_note: list = []  # QDC_RECORD as an absolute path: the program may change its folder


def recording_to() -> str | None:
    if _path_at_first_note:
        return _path_at_first_note[0]
    return os.environ.get(RECORD_VARIABLE) or None


def module_name(fn) -> str:
    """The import name of the module defining `fn` (template_values.import_name)."""
    return template_values.import_name(fn.__module__)


def arguments(params) -> list:
    """The parameters as compiled: name, kind and (where it has them) dtype, ndim, gradient."""
    out = []
    for p in params:
        a = {"name": p.name, "kind": p.kind}
        if getattr(p, "dtype", None) is not None:
            a["dtype"] = p.dtype.name
        if p.kind == "ndarray":
            a["ndim"] = p.ndim
            a["needs_grad"] = p.needs_grad
            if getattr(p, "layout", None) is not None:
                a["layout"] = list(p.layout)
        if getattr(p, "element_shape", ()):
            a["element_shape"] = list(p.element_shape)
        out.append(a)
    return out


def code_options(opts) -> dict:
    """The options that change code, other than the targets' (those are the build's to choose)."""
    out = {}
    for name in options_mod.Options.CODE_AFFECTING:
        v = getattr(opts, name)
        out[name] = v.name if hasattr(v, "np_dtype") else v
    return out


def describe_templates(kernel: str, templates) -> tuple[dict, str | None]:
    """({parameter: description}, the first problem, or None)."""
    out, problem = {}, None
    for name, value in (templates.values.items() if templates else ()):
        try:
            d = template_values.describe(value, name)
        except template_values.Undescribable as e:
            problem = problem or f"template argument '{name}' of kernel '{kernel}' cannot be described: {e}"
            out[name] = None
            continue
        out[name] = d.data
        if d.portable_problem and problem is None:
            problem = f"template argument '{name}' of kernel '{kernel}' cannot be re-created: {d.portable_problem}"
    return out, problem


def module_state(reads) -> dict:
    """{"module:attribute": description} of the module attributes a kernel reads that are data
    (numbers, dtypes, fields, config objects: a program may set them at run time, as Genesis sets
    `gs.qd_float` in `gs.init()`); the build sets each as recorded before compiling."""
    out = {}
    for module, attr, value in reads:
        try:
            d = template_values.describe(value, f"{module}.{attr}")
        except template_values.Undescribable:
            continue
        if d.portable_problem is None and not (isinstance(d.data, dict) and "named" in d.data):
            out[f"{template_values.import_name(module)}:{attr}"] = d.data
    return dict(sorted(out.items()))


def entry(fn, params, opts, arch: str, variant: str, templates, uncacheable: str | None = None,
          module_reads=()) -> dict:
    """`uncacheable`: why the variant's cache key could not be computed, if it could not;
    `module_reads`: the module attributes its source reads (cache_key.KernelDeps)."""
    kernel = f"{module_name(fn)}.{fn.__qualname__}"
    described, problem = describe_templates(kernel, templates)
    if uncacheable and problem is None:
        problem = f"kernel '{kernel}' has no cache key ({uncacheable}), so no process can look it up"
    if "<locals>" in fn.__qualname__:
        problem = (f"kernel '{kernel}' is defined inside a function, so a build cannot import it by name: define "
                   f"it at module level (or in a class) to build it ahead of time")
    e = {"module": module_name(fn), "kernel": fn.__qualname__, "variant": variant, "arches": [arch],
         "arguments": arguments(params), "templates": described, "options": code_options(opts)}
    state = module_state(module_reads)
    if state:
        e["module_state"] = state
    if problem:
        e["problem"] = problem
    return e


def note(fn, params, opts, arch: str, variant: str, templates, uncacheable: str | None = None,
         module_reads=()) -> None:
    """Keep the manifest entry of a variant this process obtained, if a manifest is being recorded
    (`uncacheable`: why its key could not be computed, recorded as its problem)."""
    path = recording_to()
    if path is None:
        return
    if not _path_at_first_note:
        _path_at_first_note.append(os.path.abspath(path))
    e = entry(fn, params, opts, arch, variant, templates, uncacheable, module_reads)
    key = manifest_file.identity(e) + arch
    if key in _entries:
        return
    if e.get("problem"):
        warnings.warn(f"qdc record: {e['problem']}; the manifest names this instantiation but "
                      f"`qdc build --manifest` cannot build it", stacklevel=5)
    _entries[key] = e
    _at_exit()


def _at_exit() -> None:
    global _registered_exit
    if not _registered_exit:
        _registered_exit = True
        atexit.register(flush)


def flush() -> None:
    """Merge what this process recorded into the manifest file."""
    path = recording_to()
    if path is None or not _entries:
        return
    try:
        manifest_file.merge_into(path, list(_entries.values()), _runs_as_quadrants())
    except (OSError, manifest_file.ManifestError) as e:
        print(f"qdc record: error: cannot write the manifest {path}: {e}", file=sys.stderr)
        return
    _entries.clear()


def _runs_as_quadrants() -> bool:
    """Whether the program made `import quadrants` resolve to qdc (qdc.install_as_quadrants())."""
    compat = sys.modules.get("qdc.quadrants_compat")  # loaded only by a program that asked for it
    return bool(compat is not None and compat.installed())


def instantiation_text(params, variant: str, arch: str, templates) -> str:
    """How an error names one instantiation: `(grad, cpu) with cfg=Config(n=3), arguments (dt: f32)`."""
    parts = [f"({variant}, {arch})"]
    if templates is not None and templates.values:
        shown = []
        for name, value in templates.values.items():
            try:
                shown.append(f"{name}={template_values.brief(template_values.describe(value, name).data)}")
            except template_values.Undescribable:
                shown.append(f"{name}=<{type(value).__qualname__} object>")
        parts.append("with " + ", ".join(shown) + ("," if params else ""))
    if params:
        parts.append("arguments (" + ", ".join(repr(p) for p in params) + ")")
    return " ".join(parts)
