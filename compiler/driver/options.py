"""Compile/runtime options (API.md §5): one dataclass, filled from defaults, files and flags."""
from __future__ import annotations

import dataclasses
import os

from qdc.runtime.contract import types as T
from qdc.runtime.contract.arches import ARCHES

from ..language import matrix

CACHE_DIR_VARIABLE = "QDC_CACHE_DIR"  # direct mode's cache folder when qd.init gives no cache_dir
# cpu_target when none is set (API.md §5): direct mode compiles for this machine, `qdc build`
# for any CPU of the architecture (compiler/targets/cpu/isa_levels.py).
DIRECT_CPU_TARGET, BUILD_CPU_TARGET = "native", "portable"


@dataclasses.dataclass
class Options:
    arch: str = "cpu"
    opt_level: int = 3
    fast_math: bool = False
    default_fp: T.DataType = matrix.DEFAULT_FP
    default_ip: T.DataType = matrix.DEFAULT_IP
    debug: bool = False
    ad_stack_size: int = 0
    default_ad_stack_size: int = 256
    ad_stack_strict: bool = False
    cache_dir: str | None = None
    cpu_max_num_threads: int | None = None
    # None: the mode's default, DIRECT_CPU_TARGET in direct mode, BUILD_CPU_TARGET in `qdc build`.
    cpu_target: str | None = None
    # The PTX target of arch "cuda" (None: DEFAULT_CUDA_ARCH, sm_70); it enters the cache key
    # through the CUDA target's cache_description.
    cuda_arch: str | None = None
    # The gfx processors arch "amdgpu" builds a code object for (None: DEFAULT_AMDGPU_TARGETS,
    # gfx90a,gfx942,gfx1100; a comma-separated string or a list); in the AMDGPU target's
    # cache_description.
    amdgpu_targets: str | list | None = None

    # Options that change generated code: part of every cache key.
    CODE_AFFECTING = ("opt_level", "fast_math", "default_fp", "default_ip", "debug",
                      "ad_stack_size", "default_ad_stack_size", "ad_stack_strict", "cpu_target")

    def update(self, **kw) -> "Options":
        for name, value in kw.items():
            if name not in {f.name for f in dataclasses.fields(self)}:
                raise TypeError(f"unknown qdc option '{name}'")
            if name in ("default_fp", "default_ip") and isinstance(value, str):
                value = T.by_name(value)
            if name == "arch" and not isinstance(value, str):
                value = str(value)
            setattr(self, name, value)
        self.validate()
        return self

    def validate(self) -> None:
        if self.arch not in ARCHES:
            raise ValueError(f"unknown arch '{self.arch}' (choose from {', '.join(ARCHES)})")
        if not 0 <= int(self.opt_level) <= 3:
            raise ValueError("opt_level must be 0..3")
        if not self.default_fp.is_float:
            raise ValueError("default_fp must be a float type")
        if self.default_ip.is_float or self.default_ip is T.u1:
            raise ValueError("default_ip must be an integer type")
        if self.ad_stack_size < 0 or self.default_ad_stack_size <= 0:
            raise ValueError("ad_stack_size must be >= 0 and default_ad_stack_size > 0")
        from ..targets.cpu.isa_levels import check_cpu_target  # pure data: no llvmlite
        check_cpu_target(self.cpu_target)
        from ..targets.cuda.arch import check_cuda_arch  # pure data too
        check_cuda_arch(self.cuda_arch)
        from ..targets.amdgpu.arch import check_amdgpu_targets  # pure data too
        check_amdgpu_targets(self.amdgpu_targets)

    def effective_cpu_target(self) -> str:
        return self.cpu_target or DIRECT_CPU_TARGET

    def effective_cuda_arch(self) -> str:
        from ..targets.cuda.arch import DEFAULT_CUDA_ARCH
        return self.cuda_arch or DEFAULT_CUDA_ARCH

    def key(self) -> dict:
        out = {n: (getattr(self, n).name if isinstance(getattr(self, n), T.DataType) else getattr(self, n))
               for n in self.CODE_AFFECTING}
        # Unset and "native" build the same code; other arches do not build CPU code at all.
        out["cpu_target"] = self.effective_cpu_target() if self.arch == "cpu" else None
        return out

    @property
    def resolved_cache_dir(self) -> str:
        """`cache_dir`, else the environment's QDC_CACHE_DIR (direct mode only: `qdc` commands
        default to ./cache), else ~/.cache/qdc."""
        default = os.path.join(os.path.expanduser("~"), ".cache", "qdc")
        return self.cache_dir or os.environ.get(CACHE_DIR_VARIABLE) or default


current = Options()  # direct mode's, set by qd.init (compiler/jit/api.py)
matrix.use_default_types(lambda: (current.default_ip, current.default_fp))


# ---- configuration files (API.md §5: flags win, then the file, then the defaults) ---------

class ConfigError(ValueError):
    """A configuration file is unreadable or sets an unknown or invalid option."""


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(Options))


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
                return path, values
        parent = os.path.dirname(folder)
        if parent == folder:
            return None, {}
        folder = parent


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
        if key not in OPTION_NAMES:
            raise ConfigError(f"{source}: unknown option '{name}' (known: {', '.join(OPTION_NAMES)})")
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
