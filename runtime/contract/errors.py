"""Exceptions users catch. Shared by compiler and runtime (the runtime never imports the compiler)."""


class QdcError(Exception):
    """Base class of every qdc error."""


class QdcCompileError(QdcError):
    """A kernel uses something outside the language; the message is `file:line:col: error: ...`."""

    def __init__(self, message: str, filename: str = "<unknown>", line: int = 0, col: int = 0,
                 source_line: str | None = None):
        self.raw_message = message
        self.filename, self.line, self.col = filename, line, col
        self.source_line = source_line
        # An error of the build rather than of a source line (a missing tool) has no location.
        located = filename != "<unknown>" or line
        text = f"{filename}:{line}:{col}: error: {message}" if located else f"error: {message}"
        if source_line is not None:
            text += "\n" + source_line.rstrip("\n") + "\n" + " " * max(col - 1, 0) + "^"
        super().__init__(text)


class CacheError(QdcError):
    """An artifact failed its integrity check or was built by an incompatible format version."""


class SignatureError(CacheError):
    """Trusted keys are configured and an entry or module record is not signed by one of them
    (unsigned, signed by another or a revoked key, or altered after signing): it is refused."""


class ModuleNotBuiltError(CacheError, FileNotFoundError):
    """The cache or bundle holds no record of the module for that arch (never built, or its last
    build failed): a CacheError for those who catch qdc's errors, a FileNotFoundError for those who
    catch a missing file."""


class KernelNotPrebuiltError(CacheError):
    """An offline process (`qd.init(offline=True)`, QDC_OFFLINE=1) launched a kernel variant that
    neither its cache nor its remote store holds: it never compiles. `kernel` is the kernel's
    module and name, `instantiation` its variant, template arguments and argument types."""

    def __init__(self, message: str, kernel: str = "", instantiation: str = ""):
        self.kernel, self.instantiation = kernel, instantiation
        super().__init__(message)


class DeviceLostError(QdcError, RuntimeError):
    """The GPU stopped running this process's work (device loss, a launch timeout, a kernel that
    crashed it): its memory and pending results are gone. `kernels` names the kernels submitted
    last, most recent last; `qd.init(...)` starts a new runtime in the same process."""

    def __init__(self, arch: str, reason: str, kernels=()):
        self.arch, self.reason, self.kernels = arch, reason, tuple(kernels)
        names = ", ".join(f"'{k}'" for k in self.kernels) or "none"
        super().__init__(f"{arch}: the device was lost ({reason}); kernels submitted last (most recent last): "
                         f"{names}. Its memory and pending results are gone: call qd.init(...) (or load the module "
                         f"again) to start a new runtime, whose fields start zeroed")


class AdStackOverflowError(QdcError):
    """A push went past an adstack's capacity; nothing was corrupted and the next launch works."""
