"""Launching a kernel whose parameters are read off its arguments: the members of a dataclass
parameter (`state.dofs.vel`) and the arrays inside template arguments.

Such a kernel's metadata maps each of those parameters to its path (KernelMeta.members,
runtime/contract/artifact.py). `member_launcher` wraps the kernel's launch function (one
argument per parameter) in a generated function taking the kernel's own arguments, which reads
every member at each launch and passes it on. For `k(a, state)` using `state.dofs.vel` and
`state.n`:

    def k(a, state):
        try:
            _q_m0, _q_m1 = state.dofs.vel, state.n
        except _q_member_errors:
            return _q_missing(a, state)
        return _q_inner(a, _q_m0, _q_m1)

A path whose root is not among the arguments is a template argument's, fixed for the compiled
variant: it is read from that object (`roots`). Only identifiers and integers reach the source.
"""
from __future__ import annotations

import keyword

_RESERVED = "_q_"


def _is_name(s) -> bool:
    return isinstance(s, str) and s.isidentifier() and not keyword.iskeyword(s) and not s.startswith(_RESERVED)


def path_text(path) -> str:
    return path[0] + "".join(f".{p}" if isinstance(p, str) else f"[{p}]" for p in path[1:])


def member_launcher(meta, inner, argument_names: list, roots: dict | None = None):
    """A function taking `argument_names` that launches `inner` (which takes one argument per
    `meta.arguments`), reading the member parameters off those arguments or `roots`."""
    roots = roots or {}
    names = list(argument_names)
    for n in names:
        if not _is_name(n):
            raise ValueError(f"kernel '{meta.name}': argument name {n!r} cannot be launched with members")
    g = {"_q_inner": inner, "_q_member_errors": (AttributeError, IndexError, KeyError, TypeError)}
    reads, values = [], []
    for k, a in enumerate(meta.arguments):
        path = meta.members.get(a.name)
        if path is None:
            if a.name not in names:
                raise ValueError(f"kernel '{meta.name}': parameter '{a.name}' is not among its arguments")
            values.append(a.name)
            continue
        root, steps = path[0], path[1:]
        if not _is_name(root) or not all(_is_name(s) or (isinstance(s, int) and s >= 0) for s in steps):
            raise ValueError(f"kernel '{meta.name}': member path {path!r} is malformed")
        if root not in names:
            if root not in roots:
                raise ValueError(f"kernel '{meta.name}': member {path_text(path)} has no argument '{root}'")
            g[f"_q_root_{root}"] = roots[root]
            root = f"_q_root_{root}"
        reads.append((f"_q_m{k}", root + "".join(f".{s}" if isinstance(s, str) else f"[{s}]" for s in steps)))
        values.append(f"_q_m{k}")
    every = ", ".join(names)
    lines = [f"def {_function_name(meta.name)}({every}):"]
    if reads:
        lines += ["    try:",
                  f"        {''.join(r[0] + ', ' for r in reads)}= {''.join(r[1] + ', ' for r in reads)}",
                  "    except _q_member_errors:",
                  f"        return _q_missing({every})"]
    lines.append(f"    return _q_inner({''.join(v + ', ' for v in values)})")
    g["_q_missing"] = _missing_reporter(meta, names, roots)
    namespace: dict = {}
    exec(compile("\n".join(lines) + "\n", f"<qdc members {meta.name}>", "exec"), g, namespace)  # noqa: S102
    return namespace[_function_name(meta.name)]


def _function_name(name: str) -> str:
    return name if _is_name(name) else "kernel"


def _missing_reporter(meta, names: list, roots: dict):
    """Raise a TypeError naming the kernel, the argument and the member it lacks."""
    def report(*args):
        scope = dict(roots)
        scope.update(zip(names, args))
        for path in meta.members.values():
            value = scope[path[0]]
            for i, step in enumerate(path[1:], 1):
                try:
                    value = getattr(value, step) if isinstance(step, str) else value[step]
                except (AttributeError, IndexError, KeyError, TypeError):
                    raise TypeError(f"kernel '{meta.name}', argument '{path[0]}': it has no member "
                                    f"{path_text(path[:i + 1])}, which the kernel was compiled to read "
                                    f"(got {type(scope[path[0]]).__qualname__})") from None
        raise AssertionError("a member read failed, then succeeded")
    return report
