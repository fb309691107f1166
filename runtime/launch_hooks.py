"""What a launcher calls around a kernel's native call (runtime/launcher.py, "Hooks"): the
callbacks and the context they see. Apart from the launcher so that the providers of hooks
(runtime/adstack.py) need not import it."""
from __future__ import annotations


class LaunchHooks:
    """Optional callbacks around the native call; runtime/launcher.py ("Hooks") states their contract.
    `report(words)`: the exception a launch's error slot words describe (or None), for the
    errors an asynchronous launch reports at sync instead of in `finish`."""
    __slots__ = ("prepare", "finish", "report")

    def __init__(self, prepare=None, finish=None, report=None):
        self.prepare, self.finish, self.report = prepare, finish, report


class LaunchContext:
    """What `prepare(ctx)` sees: the kernel's metadata, device, fields, this launch's args,
    the ctx words (np.uint64, writable) and the launcher's error slot (runtime/device.py)."""
    __slots__ = ("meta", "device", "fields", "words", "args", "errors")

    def __init__(self, meta, device, fields, words, errors=None):
        self.meta, self.device, self.fields, self.words = meta, device, fields, words
        self.args = ()
        self.errors = errors
