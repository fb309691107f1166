"""The worker processes of `qdc build -j N`: jobs handed out one at a time over pipes, as JSON
lines (nothing is pickled). A worker is forked from the building process once its kernel
modules are imported (Linux), else a new interpreter running `python -m
qdc.compiler.commands.build --worker` (build.py's `worker_main`). This module knows jobs only
as dataclasses with `module` and `kernel` names; what a worker does with one is build.py's.
"""
from __future__ import annotations

import dataclasses
import json
import os
import queue
import subprocess
import sys
import threading
import traceback

from ..targets.cpu.link import remove_stubs as remove_link_stubs
from ..targets.cpu.link_server import close_servers as close_lld_servers


def run_in_workers(todo, hello: dict, n: int, finished, here, forked=None) -> None:
    """Share `todo` between this process (`here`) and `n` worker processes, one job at a time;
    this process starts compiling while the workers are still starting up. `hello`: the build
    set-up a new interpreter is told first. `forked`: workers already running
    (`forked_workers`), else each is a new interpreter."""
    pending: queue.Queue = queue.Queue()
    for job in todo:
        pending.put(job)
    hello_line = json.dumps(hello)

    def drive(proc=None):
        if proc is None:
            proc = subprocess.Popen([sys.executable, "-m", "qdc.compiler.commands.build", "--worker"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
            proc.stdin.write(hello_line + "\n")
        job = None
        try:
            while True:
                try:
                    job = pending.get_nowait()
                except queue.Empty:
                    return
                proc.stdin.write(json.dumps(dataclasses.asdict(job)) + "\n")
                proc.stdin.flush()
                line = proc.stdout.readline()
                if not line:
                    raise BrokenPipeError
                finished(job, json.loads(line))
                job = None
        except OSError:  # the worker died (its pipe broke or closed): its job fails, the rest go on
            if job is not None:
                finished(job, {"status": "failed", "error": f"kernel '{job.module}.{job.kernel}': the build "
                                                            f"worker died (exit code {proc.wait()})"})
        finally:
            if proc.poll() is None:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
                proc.wait()

    threads = [threading.Thread(target=drive, args=(proc,), daemon=True) for proc in (forked or [None] * n)]
    for t in threads:
        t.start()
    while True:
        try:
            job = pending.get_nowait()
        except queue.Empty:
            break
        finished(job, here(job))
    for t in threads:
        t.join()
    while not pending.empty():  # every worker died
        job = pending.get_nowait()
        finished(job, {"status": "failed", "error": f"kernel '{job.module}.{job.kernel}': no build worker left"})


class ForkedWorker:
    """A build worker forked from this process once its kernel modules are imported, so that it
    starts in about a millisecond instead of the ~0.5 s an interpreter takes to import qdc,
    llvmlite and the modules (which kept `-j` from scaling). `serve(jobs, results)` speaks the
    worker protocol (minus the hello line: it has everything already) over two pipes, through
    the `stdin`/`stdout`/`poll`/`wait` that `run_in_workers` uses of a Popen."""

    def __init__(self, serve, earlier: list):
        job_read, job_write = os.pipe()
        result_read, result_write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the worker: serve jobs until the pipe closes, then leave without cleanup
            code = 0
            try:
                # Only the parent may hold an earlier worker's job pipe open, or that worker
                # would never see it close.
                for fd in [job_write, result_read] + [f.fileno() for w in earlier for f in (w.stdin, w.stdout)]:
                    os.close(fd)
                with os.fdopen(job_read, encoding="utf-8") as jobs, \
                        os.fdopen(result_write, "w", buffering=1, encoding="utf-8") as results:
                    serve(jobs, results)
            except BaseException:  # noqa: BLE001 (the parent reports the job as failed)
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                close_lld_servers()  # those it started: reaped by it, not left to init
                remove_link_stubs()
                os._exit(code)  # not the parent's atexit handlers or temporary folders
        os.close(job_read)
        os.close(result_write)
        self.stdin = os.fdopen(job_write, "w", buffering=1, encoding="utf-8")
        self.stdout = os.fdopen(result_read, encoding="utf-8")
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self):
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode


def forked_workers(serve, n: int) -> list | None:
    """`n` workers forked now, each running `serve`, before this process starts threads or
    compiles (a fork copies only the calling thread, so no lock may be held elsewhere), on
    Linux; else None: new interpreters (macOS forbids some system frameworks after fork;
    Windows has none)."""
    if not sys.platform.startswith("linux") or n < 1:
        return None
    sys.stdout.flush()
    sys.stderr.flush()  # else both processes would write what is buffered
    workers: list = []
    for _ in range(n):
        workers.append(ForkedWorker(serve, workers))
    return workers
