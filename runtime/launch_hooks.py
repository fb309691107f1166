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


def with_prepare(hooks: LaunchHooks | None, prepare) -> LaunchHooks:
    """`hooks` with `prepare` run before its own prepare."""
    if hooks is None or hooks.prepare is None:
        return LaunchHooks(prepare, *((hooks.finish, hooks.report) if hooks is not None else ()))
    first = hooks.prepare

    def both(ctx):
        prepare(ctx)
        first(ctx)
    return LaunchHooks(both, hooks.finish, hooks.report)


def with_finish(hooks: LaunchHooks | None, finish, report) -> LaunchHooks:
    """`hooks` with `finish` run after its own finish, even when that raises (so each launch
    clears what `finish` reports), and `report` consulted after its own report."""
    if hooks is None or hooks.finish is None:
        return LaunchHooks(hooks.prepare if hooks is not None else None, finish, report)
    first, first_report = hooks.finish, hooks.report

    def both():
        try:
            first()
        finally:
            finish()

    def both_reports(words, ctx_words):
        return first_report(words, ctx_words) or report(words, ctx_words)
    if report is None or first_report is None:
        return LaunchHooks(hooks.prepare, both, report or first_report)
    return LaunchHooks(hooks.prepare, both, both_reports)
