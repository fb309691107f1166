"""A module record against the entries its kernels name: each entry must hold the variant its
name says, for the module's arch, of the kernel (and parameters) the record remembers, and use
the fields the module declares, as it declares them. Loading, `qdc verify` and `qdc pack` check
this (runtime/loader.py, verify.py, bundle.py); `Cache.write_module` records what it compares."""
from __future__ import annotations

from .contract.artifact_schema import secondary_field, split_variant


def entry_signature(record: dict) -> list:
    """What a module record remembers of the entry a kernel names: [kernel, variant, parameters]."""
    return [record["meta"]["name"], record["variant"], record["meta"]["params"]]


def module_problems(where: str, body: dict, entries: dict) -> list[tuple[str, str]]:
    """How module record `body` (the file `where`) disagrees with the entries its kernels name
    (`entries`: kernel name -> Entry, for those that read fine). Each entry must hold the
    variant its name says, for the module's arch, of the kernel (and parameters) the record
    remembers, and use fields the module declares, as it declares them."""
    signatures = body.get("signatures", {})
    if not isinstance(signatures, dict):
        return [(where, "malformed metadata: signatures")]
    fields = {f[0]: f for f in body["fields"]}
    problems = []
    for name, entry in sorted(entries.items()):
        reason = (_kernel_problem(name, entry, body["arch"], signatures.get(name))
                  or _field_problem(name, entry, fields))
        if reason:
            problems.append((where, reason))
    return problems


def _kernel_problem(name: str, entry, arch: str, signature) -> str | None:
    _, variant = split_variant(name)
    record, meta = entry.record, entry.meta
    held = f"entry {entry.key[:12]}..., which holds the {record['variant']} variant of kernel '{meta.name}'"
    if record["variant"] != variant or meta.is_grad != (variant == "grad"):
        return f"kernel '{name}' names {held}, not the {variant} variant (the module record is mixed up: rebuild)"
    if record["arch"] != arch:
        return f"kernel '{name}' names {held} built for arch '{record['arch']}', not '{arch}' (rebuild)"
    if signature is None:  # a record written before signatures were kept
        return None
    if not (isinstance(signature, list) and len(signature) == 3):
        return f"malformed metadata: the signature of kernel '{name}'"
    kernel, _, params = signature
    if kernel != meta.name:
        return f"kernel '{name}' names {held}, not of kernel '{kernel}' (the module record is mixed up: rebuild)"
    if params != record["meta"]["params"]:
        return (f"kernel '{name}' names {held} taking ({_params_text(record['meta']['params'])}), but the module "
                f"was built for ({_params_text(params)}) (rebuild)")
    return None


def _params_text(params) -> str:
    try:
        return ", ".join(f"{p[0]}: {p[2]}" if p[1] == "scalar" else f"{p[0]}: ndarray({p[2]}, ndim={p[3]})"
                         for p in params)
    except (TypeError, IndexError, KeyError):
        return "?"


def _field_problem(name: str, entry, fields: dict) -> str | None:
    for fm in entry.meta.fields:
        base, secondary = secondary_field(fm.name) if fm.is_grad else (fm.name, None)
        declared = fields.get(base)
        used = f"{fm.dtype}{list(fm.shape)}"
        if declared is None:
            return f"kernel '{name}' uses field '{base}' ({used}), which the module does not declare (rebuild)"
        if declared[1] != fm.dtype or list(declared[2]) != list(fm.shape):
            return (f"kernel '{name}' uses field '{base}' as {used}, but the module declares it "
                    f"{declared[1]}{list(declared[2])} (rebuild)")
        if secondary == "grad" and not declared[3] or secondary == "dual" and not declared[4:5] == [True]:
            return (f"kernel '{name}' uses '{fm.name}', but the module declares field '{base}' without "
                    f"needs_{secondary} (rebuild)")
    return None
