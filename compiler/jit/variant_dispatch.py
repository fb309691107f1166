"""The launch code of a kernel with several variants in one runtime: one dict lookup, keyed by
what picks the variant, finds its launch function, which takes the kernel's other arguments.

What picks the variant, parameter by parameter:
- a dataclass argument: the key of its structure (dataclass_args.argument_key), found by the
  instance's id in `LIVE_KEYS`, which holds every live frozen instance whose key was computed
  (an entry goes with its instance, so an id found there is that instance's);
- a template argument: its class and the argument itself where every argument equal to it
  (same class, `==`) has its specialisation_key (templates.fast_keyable), else, for an object
  keyed by identity (a config object with an `__eq__` of its own), a token standing for that
  very object (`identity_token`, found by id while it lives);
- an ndarray parameter whose dtype, rank or gradient follows the argument (`qd.types.ndarray()`,
  `qd.Tensor`): the argument's part of the specialisation key, computed by the kernel's own
  `specialised_argument` (the same function the slow path keys with).

For `k(a, state: State, cfg: qd.template(), e: qd.Tensor)` the kernel function's code becomes

    def k(a, state, cfg, e):
        try:
            _q_launch = _q_variants[_q_dataclass_keys[_q_id(state)], cfg.__class__,
                                    _q_identity(_q_id(cfg), cfg), _q_array_key3(e),]
        except _q_miss:
            return _q_slow(a, state, cfg, e)
        return _q_launch(a, state, e)

Any argument the key cannot speak for misses and takes the slow path, which computes its key,
compiles or launches as before (and reports a bad argument).
"""
from __future__ import annotations

from ..driver.templates import fast_keyable, identity_token, IDENTITY_TOKENS
from ..language import dataclass_args


class VariantDispatch:
    """`dataclass_names`, `template_names`: those parameters; `arrays`: {parameter name: its
    part of the specialisation key as a function of the argument}; `runtime_names`: what the
    variants' launch functions take."""

    def __init__(self, function, dataclass_names: list[str], template_names: list[str], arrays: dict,
                 runtime_names: list[str]):
        name = function.__code__.co_name
        every = ", ".join(_signature(function))
        array_keys = {n: f"_q_array_key{k}" for k, n in enumerate(arrays)}
        key = ", ".join([f"_q_dataclass_keys[_q_id({n})]" for n in dataclass_names]
                        + [f"{n}.__class__, _q_identity(_q_id({n}), {n})" for n in template_names]
                        + [f"{array_keys[n]}({n})" for n in arrays])
        src = (f"def {name}({every}):\n"
               f"    try:\n"
               f"        _q_launch = _q_variants[{key},]\n"
               f"    except _q_miss:\n"
               f"        return _q_slow({every})\n"
               f"    return _q_launch({', '.join(runtime_names)})\n")
        self.function, self.stub = function, function.__code__
        self.dataclass_names, self.template_names = list(dataclass_names), list(template_names)
        self.array_names = list(arrays)
        self.variants: dict = {}
        function.__globals__.update({"_q_variants": self.variants, "_q_miss": (KeyError, TypeError),
                                     "_q_dataclass_keys": dataclass_args.LIVE_KEYS, "_q_id": id,
                                     "_q_identity": IDENTITY_TOKENS.get})
        function.__globals__.update({array_keys[n]: f for n, f in arrays.items()})
        namespace: dict = {}
        exec(compile(src, f"<qdc variant dispatch {name}>", "exec"), function.__globals__, namespace)  # noqa: S102
        self.code = namespace[name].__code__

    def add(self, instances: dict, templates, array_keys: dict, launch) -> bool:
        """Let calls with these dataclass and template arguments, and arrays of these
        specialisation keys ({name: key part}), go straight to `launch`, if the key can say so;
        whether it could."""
        keys = [dataclass_args.LIVE_KEYS.get(id(instances[n])) for n in self.dataclass_names]
        if None in keys:  # a mutable dataclass: keyed at every call
            return False
        parts = []
        for n in self.template_names:
            v = templates.values[n]
            if fast_keyable(v):
                parts += (v.__class__, v)
                continue
            token = identity_token(v)
            if token is None:
                return False
            parts += (v.__class__, token)
        self.variants[(*keys, *parts, *(array_keys[n] for n in self.array_names))] = launch
        return True

    def invalidate(self) -> None:
        """At `qd.init` (context.on_reset): the launch functions belong to the old runtime."""
        self.variants.clear()
        self.function.__code__ = self.stub


def _signature(function) -> list[str]:
    code = function.__code__
    return list(code.co_varnames[:code.co_argcount])
