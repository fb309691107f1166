"""Compile/runtime options (docs/api.md, Configuration): one dataclass, filled from defaults, files and flags.

An `Options` is always passed explicitly: `qdc build` makes one per build and hands it down
(build -> compile_kernel -> front end, passes, targets); direct mode's is the one `qd.init`
set (compiler/jit/api.py, `direct_options`), which the kernel objects hand down the same way.
Nothing below the kernel objects reads a process-wide value."""
from __future__ import annotations

import dataclasses
import os
import re

from qdc.runtime.contract import arches
from qdc.runtime.contract import types as T
from qdc.runtime.contract.python_scope import DEFAULT_FP, DEFAULT_IP

CACHE_DIR_VARIABLE = "QDC_CACHE_DIR"  # direct mode's cache folder when qd.init gives no cache_dir


def target_options() -> dict:
    """name -> (arch, TargetOption) of every option a target declares (compiler/targets/base.py),
    as the arch table stands when called."""
    from .. import targets
    return {option.name: (arch, option) for arch in targets.available() for option in targets.get(arch).options}


@dataclasses.dataclass(init=False)
class Options:
    """The options of docs/api.md: the common ones below, and those the targets declare (`cpu_target`,
    `cuda_arch`, `amdgpu_targets`, ...), read and set as attributes too (None: unset)."""
    arch: str = "cpu"
    opt_level: int = 3
    fast_math: bool = False
    default_fp: T.DataType = DEFAULT_FP
    default_ip: T.DataType = DEFAULT_IP
    debug: bool = False
    ad_stack_size: int = 0
    default_ad_stack_size: int = 256
    ad_stack_strict: bool = False
    cache_dir: str | None = None
    cpu_max_num_threads: int | None = None
    random_seed: int = 0  # where qd.random()'s streams start (runtime/random_stream.py); not in cache keys
    # Direct mode takes every kernel from the cache (or remote store) and never compiles
    # (compiler/jit/offline_cache.py); QDC_OFFLINE=1 sets it where qd.init does not.
    offline: bool = False
    # Public keys whose signatures make a cache entry runnable, and keys revoked (runtime/signing.py):
    # key files or their text, a list or one comma-separated string; None: $QDC_TRUSTED_KEYS, $QDC_REVOKED_KEYS.
    trusted_keys: object = None
    revoked_keys: object = None
    # The targets' options that were set, by name.
    target_values: dict = dataclasses.field(default_factory=dict)

    # Options that change generated code: part of every cache key (with the targets' keyed ones).
    CODE_AFFECTING = ("opt_level", "fast_math", "default_fp", "default_ip", "debug",
                      "ad_stack_size", "default_ad_stack_size", "ad_stack_strict")

    def __init__(self, **values):
        self.target_values = {}
        for f in _COMMON_FIELDS:
            setattr(self, f.name, f.default)
        for name, value in values.items():
            setattr(self, name, value)

    def __getattr__(self, name):  # only for names that are no attribute: the targets' options
        if name in target_options():
            return self.target_values.get(name)
        raise AttributeError(f"'Options' object has no attribute '{name}'")

    def __setattr__(self, name, value):
        if name not in _COMMON_NAMES and name in target_options():
            self.target_values[name] = value
        else:
            object.__setattr__(self, name, value)

    def copy(self, **values) -> "Options":
        """These options with `values` replaced, unchecked."""
        out = Options(**{f.name: getattr(self, f.name) for f in _COMMON_FIELDS}, **self.target_values)
        for name, value in values.items():
            setattr(out, name, value)
        return out

    def update(self, **kw) -> "Options":
        known = option_names()
        for name, value in kw.items():
            if name not in known:
                raise TypeError(f"unknown qdc option '{name}'")
            if name in ("default_fp", "default_ip") and isinstance(value, str):
                value = T.by_name(value)
            if name == "arch" and not isinstance(value, str):
                value = str(value)
            setattr(self, name, value)
        self.validate()
        return self

    def validate(self) -> None:
        if self.arch not in arches.names():
            raise ValueError(f"unknown arch '{self.arch}' (choose from {', '.join(arches.names())})")
        if not 0 <= int(self.opt_level) <= 3:
            raise ValueError("opt_level must be 0..3")
        if not self.default_fp.is_float:
            raise ValueError("default_fp must be a float type")
        if self.default_ip.is_float or self.default_ip is T.u1:
            raise ValueError("default_ip must be an integer type")
        if self.ad_stack_size < 0 or self.default_ad_stack_size <= 0:
            raise ValueError("ad_stack_size must be >= 0 and default_ad_stack_size > 0")
        for name in ("trusted_keys", "revoked_keys"):
            value = getattr(self, name)
            if not (value is None or isinstance(value, (str, bytes, os.PathLike, list, tuple))):
                raise ValueError(f"{name} must be key files or keys' text (a list, or one string), not "
                                 f"{type(value).__name__}")
        for name, (_, option) in target_options().items():
            option.check(self.target_values.get(name))

    def effective(self, name: str):
        """A target option's value, else its default (direct mode's: `qdc build` sets its own)."""
        value = getattr(self, name)
        return target_options()[name][1].default if value is None else value

    def key(self) -> dict:
        out = {n: (getattr(self, n).name if isinstance(getattr(self, n), T.DataType) else getattr(self, n))
               for n in self.CODE_AFFECTING}
        # A keyed option's unset and default values build the same code; other arches none of it.
        for name, (arch, option) in target_options().items():
            if option.keyed:
                out[name] = self.effective(name) if self.arch == arch else None
        return out

    @property
    def resolved_cache_dir(self) -> str:
        """`cache_dir`, else the environment's QDC_CACHE_DIR (direct mode only: `qdc` commands
        default to ./cache), else ~/.cache/qdc."""
        default = os.path.join(os.path.expanduser("~"), ".cache", "qdc")
        return self.cache_dir or os.environ.get(CACHE_DIR_VARIABLE) or default


_COMMON_FIELDS = tuple(f for f in dataclasses.fields(Options) if f.name != "target_values")
_COMMON_NAMES = frozenset(f.name for f in dataclasses.fields(Options))


def option_names() -> tuple:
    """Every option's name: the common ones, then the targets' in arch table order."""
    return tuple(f.name for f in _COMMON_FIELDS) + tuple(target_options())




# ---- configuration files (docs/api.md, Configuration: flags win, then the file, then the defaults) ---------

class ConfigError(ValueError):
    """A configuration file is unreadable or sets an unknown or invalid option."""


def find_config(start: str = ".") -> tuple[str | None, dict]:
    """The options in the nearest `qdc.yaml`, or `[tool.qdc]` of the nearest `pyproject.toml`,
    searching from `start` upwards and stopping at the first folder that has either file."""
    folder = os.path.abspath(start)
    while True:
        yaml_path = os.path.join(folder, "qdc.yaml")
        toml_path = os.path.join(folder, "pyproject.toml")
        for path, read in ((yaml_path, _read_yaml), (toml_path, _read_pyproject)):
            if os.path.isfile(path):
                values = read(path)
                if isinstance(values.get("cache_dir"), str):  # relative to the file, not the caller
                    values["cache_dir"] = os.path.join(folder, os.path.expanduser(values["cache_dir"]))
                for name in ("trusted_keys", "revoked_keys"):  # key files too
                    if name in values:
                        values[name] = _key_paths(values[name], folder)
                return path, values
        parent = os.path.dirname(folder)
        if parent == folder:
            return None, {}
        folder = parent


def _key_paths(value, folder: str):
    """A trusted/revoked keys setting of a file with its key files' paths relative to `folder`.
    A key's own text (`qdc-ed25519 <base64> name`, `@revoked ...`: it has spaces) and a bare
    fingerprint (32 hex digits) stay as they are."""
    items = value.split(",") if isinstance(value, str) and not value.strip().startswith("@") else value
    if not isinstance(items, list):
        return value
    return [os.path.join(folder, os.path.expanduser(i.strip())) if isinstance(i, str) and i.strip()
            and not _KEY_TEXT.search(i.strip()) else i for i in items]


_KEY_TEXT = re.compile(r"\s|^@|^[0-9a-fA-F]{32}$")


def _read_yaml(path: str) -> dict:
    import yaml
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read it: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of option names to values")
    return _normalise(data, path)


def _read_pyproject(path: str) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise ConfigError(f"{path}: reading [tool.qdc] needs Python 3.11+ or the 'tomli' package") from None
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: cannot read it: {e}") from None
    table = data.get("tool", {}).get("qdc", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.qdc] must be a table")
    return _normalise(table, f"{path} [tool.qdc]")


def _normalise(data: dict, source: str) -> dict:
    out = {}
    for name, value in data.items():
        key = str(name).replace("-", "_")
        if key not in option_names() and key != "remote":  # `remote`: the store URL of `qdc` commands
            raise ConfigError(f"{source}: unknown option '{name}' (known: {', '.join(option_names())})")
        out[key] = value
    return out


def resolve(flags: dict, file_values: dict, source: str = "configuration file") -> Options:
    """Options from defaults, overridden by the file, overridden by flags that were given (not None)."""
    opts = Options()
    try:
        opts.update(**file_values)
    except (TypeError, ValueError, KeyError) as e:
        raise ConfigError(f"{source}: {e}") from None
    opts.update(**{k: v for k, v in flags.items() if v is not None})
    return opts
