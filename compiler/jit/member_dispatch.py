"""The launch code of a kernel with dataclass parameters: one dict lookup, keyed by the
structure of its dataclass arguments and by its template arguments, finds the launch function
of their variant (which reads the members off the arguments: runtime/member_arguments.py).

For `k(a, state: State, cfg: qd.template())` the kernel function's code becomes

    def k(a, state, cfg):
        try:
            _q_launch = _q_member_variants[_q_dataclass_keys[_q_id(state)], cfg.__class__, cfg]
        except _q_miss:
            return _q_slow(a, state, cfg)
        return _q_launch(a, state)

`_q_dataclass_keys` holds the key of every live frozen dataclass instance whose key was computed
(dataclass_args.argument_key; an entry goes with its instance, so an id found there is that
instance's): any other argument misses and takes the slow path, which computes its key, compiles
or launches as before. Template arguments are keyed as TemplateDispatch keys them, and a variant
enters only when each of them is of a class for which that is sound (templates._fast_keyable).
"""
from __future__ import annotations

from ..driver.templates import _fast_keyable
from ..language import dataclass_args


class MemberDispatch:
    def __init__(self, function, dataclass_names: list[str], template_names: list[str], runtime_names: list[str]):
        name = function.__code__.co_name
        every = ", ".join(_signature(function))
        key = ", ".join([f"_q_dataclass_keys[_q_id({n})]" for n in dataclass_names]
                        + [f"{n}.__class__, {n}" for n in template_names])
        src = (f"def {name}({every}):\n"
               f"    try:\n"
               f"        _q_launch = _q_member_variants[{key},]\n"
               f"    except _q_miss:\n"
               f"        return _q_slow({every})\n"
               f"    return _q_launch({', '.join(runtime_names)})\n")
        self.function, self.stub = function, function.__code__
        self.dataclass_names, self.template_names = list(dataclass_names), list(template_names)
        self.variants: dict = {}
        function.__globals__.update({"_q_member_variants": self.variants, "_q_miss": (KeyError, TypeError),
                                     "_q_dataclass_keys": dataclass_args.LIVE_KEYS, "_q_id": id})
        namespace: dict = {}
        exec(compile(src, f"<qdc member dispatch {name}>", "exec"), function.__globals__, namespace)  # noqa: S102
        self.code = namespace[name].__code__

    def add(self, instances: dict, templates, launch) -> bool:
        """Let calls with these dataclass and template arguments go straight to `launch`, if
        their key can say so; whether it could."""
        keys = [dataclass_args.LIVE_KEYS.get(id(instances[n])) for n in self.dataclass_names]
        values = [templates.values[n] for n in self.template_names] if self.template_names else []
        if None in keys or not all(_fast_keyable(v) for v in values):
            return False
        self.variants[(*keys, *(x for v in values for x in (v.__class__, v)))] = launch
        return True

    def invalidate(self) -> None:
        """At `qd.init` (context.on_reset): the launch functions belong to the old runtime."""
        self.variants.clear()
        self.function.__code__ = self.stub


def _signature(function) -> list[str]:
    code = function.__code__
    return list(code.co_varnames[:code.co_argcount])
