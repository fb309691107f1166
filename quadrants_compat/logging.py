"""`quadrants._logging` (`qd._logging`): Quadrants' logging functions and levels, on Python's
`logging` (logger "qdc"). Programs replace the functions (`qd._logging.warn = ...`) to route the
messages elsewhere, and get them back from `_get_logging(level)`."""
from __future__ import annotations

import logging as _py_logging

DEBUG, TRACE, INFO, WARN, ERROR, CRITICAL = "debug", "trace", "info", "warn", "error", "critical"
supported_log_levels = [DEBUG, TRACE, INFO, WARN, ERROR, CRITICAL]

_LEVELS = {TRACE: 5, DEBUG: _py_logging.DEBUG, INFO: _py_logging.INFO, WARN: _py_logging.WARNING,
           ERROR: _py_logging.ERROR, CRITICAL: _py_logging.CRITICAL}
logger = _py_logging.getLogger("qdc")


def _level(name: str) -> int:
    try:
        return _LEVELS[str(name).lower()]
    except KeyError:
        raise ValueError(f"unknown logging level {name!r}; one of {', '.join(supported_log_levels)}") from None


def set_logging_level(level: str) -> None:
    """Messages of `level` and above are logged from now on (qd.init(log_level=...) too)."""
    logger.setLevel(_level(level))


def is_logging_effective(level: str) -> bool:
    return logger.isEnabledFor(_level(level))


def _get_logging(name: str):
    """The logging function of level `name`: `f(msg, *args, **kwargs)` logs `msg.format(...)`."""
    level = _level(name)

    def log(msg, *args, **kwargs):
        if logger.isEnabledFor(level):
            logger.log(level, str(msg).format(*args, **kwargs) if args or kwargs else str(msg))

    log.__name__ = name
    return log


debug = _get_logging(DEBUG)
trace = _get_logging(TRACE)
info = _get_logging(INFO)
warn = _get_logging(WARN)
error = _get_logging(ERROR)
critical = _get_logging(CRITICAL)
