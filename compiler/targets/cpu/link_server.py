"""Running LLD for many links without starting it for each (compiler/targets/cpu/link.py links
each kernel's library for another platform with ld.lld or ld64.lld).

Starting LLD costs about 17 ms of CPU, ten times a kernel library's link: the dynamic loader
maps and relocates libLLVM (over 400,000 relocations) and runs its static constructors. So on
Linux one LLD process per build process is started once, with a small library preloaded
(`LD_PRELOAD`) that takes the place of the C library's `__libc_start_main`: instead of running
LLD's `main`, the process reads link requests from its standard input and runs each in an
address space already loaded, then answers with LLD's exit status and CPU time.

Each link runs LLD as a library, `lld::safeLldMain` (what LLD's own tests use to run a link
again in one process: after each link it destroys the linker's state, so the next one starts
as in a fresh process, and a fatal error or crash returns to it instead of exiting), with its
messages written to the request's file: about 0.3 ms of CPU for a kernel library's ELF link and
0.7 for a Mach-O one (its code signature's SHA-256 most of it). A fork per link, which ran
LLD's `main` in a copy of the process, cost ~3.5-4.5 ms more, nearly all the kernel's (copying
the page tables, faulting LLD's code and data in again, tearing the copy down); it remains the
way for an LLD whose executable does not export `safeLldMain` (as Debian's does). After a fatal
error or a crash LLD cannot run again: the server answers, says so, and ends, and the next link
starts another. The output is the same bytes either way, and as LLD started anew
(tests/targets/cpu/test_cpu_link_server.py). The preloaded library is made here by LLVM and
linked by the host's linker; where any of this is not possible (not Linux, no host linker, an
LLD that is not one executable such as `python -m ziglang`) or the server dies, LLD is run
directly.

A request: a 32-bit length, then NUL-terminated strings: the file LLD's messages go to, then
LLD's argv. The answer: four 64-bit integers: the wait status of LLD's exit code (-1: it could
not run), user and system CPU time of the link in microseconds, and 1 where the server ends
after this answer (else 0).
"""
from __future__ import annotations

import atexit
import functools
import os
import struct
import subprocess
import sys
import tempfile
import threading

from ... import timings

# struct rusage begins with ru_utime and ru_stime, two struct timeval {i64 seconds, i64
# microseconds} on 64-bit Linux; the whole struct is 144 bytes. O_WRONLY|O_CREAT|O_TRUNC is
# 0x241 on every 64-bit Linux qdc builds on (x86-64, aarch64). RTLD_NEXT is (void *)-1,
# RTLD_DEFAULT null, RUSAGE_SELF 0. `lld::safeLldMain(int, const char **, raw_ostream &stdout,
# raw_ostream &stderr)` returns `struct {int ret; bool canRunAgain;}` in one register on both
# ABIs; both streams are `llvm::errs()`, unbuffered, on the messages' file for the link.
_SHIM_IR = r'''
@real_main = internal global ptr null
@libc_start_main = private constant [18 x i8] c"__libc_start_main\00"

declare ptr @dlsym(ptr, ptr)
declare i64 @read(i32, ptr, i64)
declare i64 @write(i32, ptr, i64)
declare i32 @fork()
declare i32 @wait4(i32, ptr, i32, ptr)
declare i32 @open(ptr, i32, ...)
declare i32 @dup2(i32, i32)
declare i32 @close(i32)
declare void @exit(i32) noreturn
declare ptr @malloc(i64)
declare void @free(ptr)
declare i32 @dup(i32)
declare i32 @getrusage(i32, ptr)
declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)

@safe_lld_main = private constant [51 x i8] c"_ZN3lld11safeLldMainEiPPKcRN4llvm11raw_ostreamES5_\00"
@crash_recovery = private constant [40 x i8] c"_ZN4llvm20CrashRecoveryContext6EnableEv\00"
@errs = private constant [16 x i8] c"_ZN4llvm4errsEv\00"

; The C library calls the program's main through this: it calls the real one with serve as main.
define i32 @__libc_start_main(ptr %main, i32 %argc, ptr %argv, ptr %init, ptr %fini, ptr %rtld_fini,
                              ptr %stack_end) {
entry:
  store ptr %main, ptr @real_main
  %real = call ptr @dlsym(ptr inttoptr (i64 -1 to ptr), ptr @libc_start_main)
  %r = call i32 %real(ptr @serve, i32 %argc, ptr %argv, ptr %init, ptr %fini, ptr %rtld_fini, ptr %stack_end)
  ret i32 %r
}

; Reads exactly %n bytes of standard input to %p: 0, or -1 at its end or on an error.
define internal i32 @read_all(ptr %p, i64 %n) {
entry:
  %at = alloca ptr
  %left = alloca i64
  store ptr %p, ptr %at
  store i64 %n, ptr %left
  br label %loop
loop:
  %l = load i64, ptr %left
  %done = icmp eq i64 %l, 0
  br i1 %done, label %ok, label %more
more:
  %a = load ptr, ptr %at
  %got = call i64 @read(i32 0, ptr %a, i64 %l)
  %bad = icmp sle i64 %got, 0
  br i1 %bad, label %fail, label %advance
advance:
  %a1 = getelementptr i8, ptr %a, i64 %got
  store ptr %a1, ptr %at
  %l1 = sub i64 %l, %got
  store i64 %l1, ptr %left
  br label %loop
ok:
  ret i32 0
fail:
  ret i32 -1
}

; A struct timeval's microseconds.
define internal i64 @micros(ptr %timeval) {
entry:
  %usec_at = getelementptr i64, ptr %timeval, i64 1
  %sec = load i64, ptr %timeval
  %usec = load i64, ptr %usec_at
  %sec_us = mul i64 %sec, 1000000
  %total = add i64 %sec_us, %usec
  ret i64 %total
}

; Answers requests until standard input ends.
define internal i32 @serve(i32 %argc, ptr %argv, ptr %envp) {
entry:
  %len = alloca i32
  %i = alloca i64
  %k = alloca i64
  %status = alloca i32
  %before = alloca [18 x i64]
  %usage = alloca [18 x i64]
  %reply = alloca [4 x i64]
  %again = alloca i1
  %errs_slot = alloca ptr
  store i1 true, ptr %again
  %safe = call ptr @dlsym(ptr null, ptr @safe_lld_main)
  %enable = call ptr @dlsym(ptr null, ptr @crash_recovery)
  %errs_of = call ptr @dlsym(ptr null, ptr @errs)
  %no_safe = icmp eq ptr %safe, null
  %no_enable = icmp eq ptr %enable, null
  %no_errs = icmp eq ptr %errs_of, null
  %lacking0 = or i1 %no_safe, %no_enable
  %lacking = or i1 %lacking0, %no_errs
  br i1 %lacking, label %request, label %recover
recover:                                  ; LLD's fatal errors and crashes return to safeLldMain
  call void %enable()
  %errs_stream = call ptr %errs_of()
  store ptr %errs_stream, ptr %errs_slot
  br label %request
request:
  %r1 = call i32 @read_all(ptr %len, i64 4)
  %end1 = icmp ne i32 %r1, 0
  br i1 %end1, label %quit, label %body
body:
  %n32 = load i32, ptr %len
  %n = zext i32 %n32 to i64
  %buf = call ptr @malloc(i64 %n)
  %r2 = call i32 @read_all(ptr %buf, i64 %n)
  %end2 = icmp ne i32 %r2, 0
  br i1 %end2, label %quit, label %split
split:                                    ; args[k]: the string after the k-th NUL
  %slots = add i64 %n, 1
  %size = mul i64 %slots, 8
  %args = call ptr @malloc(i64 %size)
  store ptr %buf, ptr %args
  store i64 0, ptr %i
  store i64 1, ptr %k
  br label %scan
scan:
  %iv = load i64, ptr %i
  %i1 = add i64 %iv, 1
  store i64 %i1, ptr %i
  %last = icmp uge i64 %i1, %n
  br i1 %last, label %fork, label %look
look:
  %cp = getelementptr i8, ptr %buf, i64 %iv
  %c = load i8, ptr %cp
  %nul = icmp eq i8 %c, 0
  br i1 %nul, label %start, label %scan
start:
  %kv = load i64, ptr %k
  %slot = getelementptr ptr, ptr %args, i64 %kv
  %s = getelementptr i8, ptr %buf, i64 %i1
  store ptr %s, ptr %slot
  %k1 = add i64 %kv, 1
  store i64 %k1, ptr %k
  br label %scan
fork:
  %count = load i64, ptr %k
  %endslot = getelementptr ptr, ptr %args, i64 %count
  store ptr null, ptr %endslot
  %messages = load ptr, ptr %args         ; args[0]: the messages' file; LLD's argv after it
  %argc1 = sub i64 %count, 1
  %argc32 = trunc i64 %argc1 to i32
  %argv1 = getelementptr ptr, ptr %args, i64 1
  br i1 %lacking, label %forking, label %in_process
in_process:                               ; LLD as a library, which resets its state after each link
  %g0 = call i32 @getrusage(i32 0, ptr %before)
  %fd_here = call i32 (ptr, i32, ...) @open(ptr %messages, i32 577, i32 384)
  %no_file_here = icmp slt i32 %fd_here, 0
  br i1 %no_file_here, label %no_child, label %redirect_here
redirect_here:                            ; the answers' pipe is put back after the link
  %saved1 = call i32 @dup(i32 1)
  %saved2 = call i32 @dup(i32 2)
  %h1 = call i32 @dup2(i32 %fd_here, i32 1)
  %h2 = call i32 @dup2(i32 %fd_here, i32 2)
  %h3 = call i32 @close(i32 %fd_here)
  %errs_here = load ptr, ptr %errs_slot
  %safe_return = call i64 %safe(i32 %argc32, ptr %argv1, ptr %errs_here, ptr %errs_here)
  %h4 = call i32 @dup2(i32 %saved1, i32 1)
  %h5 = call i32 @dup2(i32 %saved2, i32 2)
  %h6 = call i32 @close(i32 %saved1)
  %h7 = call i32 @close(i32 %saved2)
  %g1 = call i32 @getrusage(i32 0, ptr %usage)
  %ret = and i64 %safe_return, 255         ; { i32 ret; bool canRunAgain } in one register
  %ret_status = shl i64 %ret, 8            ; the wait status of exit code ret
  %again_bit = and i64 %safe_return, 4294967296
  %can_again = icmp ne i64 %again_bit, 0
  store i1 %can_again, ptr %again
  br label %measured
forking:
  %pid = call i32 @fork()
  %failed = icmp slt i32 %pid, 0
  br i1 %failed, label %no_child, label %forked
forked:
  %child = icmp eq i32 %pid, 0
  br i1 %child, label %link, label %wait
link:
  %fd = call i32 (ptr, i32, ...) @open(ptr %messages, i32 577, i32 384)
  %no_file = icmp slt i32 %fd, 0          ; LLD must not write into the answers
  br i1 %no_file, label %give_up, label %redirect
give_up:
  call void @exit(i32 125)
  unreachable
redirect:
  %o1 = call i32 @dup2(i32 %fd, i32 1)
  %o2 = call i32 @dup2(i32 %fd, i32 2)
  %o3 = call i32 @close(i32 0)
  %lld = load ptr, ptr @real_main
  %rc = call i32 %lld(i32 %argc32, ptr %argv1, ptr %envp)
  call void @exit(i32 %rc)
  unreachable
wait:
  call void @llvm.memset.p0.i64(ptr %before, i8 0, i64 144, i1 false)
  %w = call i32 @wait4(i32 %pid, ptr %status, i32 0, ptr %usage)
  %st = load i32, ptr %status
  %st64 = sext i32 %st to i64
  br label %measured
measured:                                 ; ru_utime and ru_stime, less what was spent before
  %code_here = phi i64 [ %ret_status, %redirect_here ], [ %st64, %wait ]
  %user_after = call i64 @micros(ptr %usage)
  %user_before = call i64 @micros(ptr %before)
  %user = sub i64 %user_after, %user_before
  %stime_after = getelementptr i64, ptr %usage, i64 2
  %stime_before = getelementptr i64, ptr %before, i64 2
  %system_after = call i64 @micros(ptr %stime_after)
  %system_before = call i64 @micros(ptr %stime_before)
  %system = sub i64 %system_after, %system_before
  br label %answer
no_child:
  br label %answer
answer:
  %code = phi i64 [ %code_here, %measured ], [ -1, %no_child ]
  %ucpu = phi i64 [ %user, %measured ], [ 0, %no_child ]
  %scpu = phi i64 [ %system, %measured ], [ 0, %no_child ]
  %go_on = load i1, ptr %again            ; not after a fatal error or a crash: LLD's state is lost
  %ends = select i1 %go_on, i64 0, i64 1
  %r0p = getelementptr i64, ptr %reply, i64 0
  %r1p = getelementptr i64, ptr %reply, i64 1
  %r2p = getelementptr i64, ptr %reply, i64 2
  %r3p = getelementptr i64, ptr %reply, i64 3
  store i64 %code, ptr %r0p
  store i64 %ucpu, ptr %r1p
  store i64 %scpu, ptr %r2p
  store i64 %ends, ptr %r3p
  %wrote = call i64 @write(i32 1, ptr %reply, i64 32)
  call void @free(ptr %args)
  call void @free(ptr %buf)
  br i1 %go_on, label %request, label %quit
quit:
  ret i32 0
}
'''


@functools.lru_cache(maxsize=None)
def _shim(link_on_host) -> bytes | None:
    """The preloaded library, for this host; None where it cannot be made."""
    import llvmlite.binding as llvm
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    try:
        module = llvm.parse_assembly(f'target triple = "{llvm.get_process_triple()}"\n' + _SHIM_IR)
        module.verify()
        target = llvm.Target.from_triple(llvm.get_process_triple())
        machine = target.create_target_machine(cpu="generic", features="", opt=1, reloc="pic")
        return link_on_host([machine.emit_object(module)])
    except (RuntimeError, OSError):
        return None


class _Server:
    """One LLD process serving links (see the module docstring)."""

    def __init__(self, executable: str, shim: bytes):
        self.lock = threading.Lock()
        preload = os.memfd_create("qdc-lld-server")
        try:
            os.write(preload, shim)
            env = dict(os.environ)
            env["LD_PRELOAD"] = ":".join(filter(None, [f"/proc/self/fd/{preload}", env.get("LD_PRELOAD")]))
            self.proc = subprocess.Popen([executable], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, env=env, pass_fds=(preload,))
        finally:
            os.close(preload)

    def run(self, command: list) -> tuple[int, str, float, bool] | None:
        """(exit code, messages, CPU seconds, whether the server ended after it) of one LLD run;
        None when the server cannot run it."""
        with tempfile.NamedTemporaryFile(prefix="qdc-lld-", suffix=".txt") as messages:
            request = b"".join(os.fsencode(part) + b"\0" for part in [messages.name, *command])
            with self.lock:
                try:
                    self.proc.stdin.write(struct.pack("=I", len(request)) + request)
                    self.proc.stdin.flush()
                    answer = self.proc.stdout.read(32)
                except OSError:
                    answer = b""
            if len(answer) < 32:
                return None
            status, user, system, ends = struct.unpack("=qqqq", answer)
            if status < 0:
                return None
            return (os.waitstatus_to_exitcode(status), messages.read().decode(errors="replace"), (user + system) / 1e6,
                    bool(ends))

    def close(self) -> None:
        """Ends the server and reaps it (its CPU time, and its children's, then count to this
        process's children)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.wait()


_servers: dict = {}  # (process id, LLD executable) -> _Server, or None where one could not start
_servers_lock = threading.Lock()


def run_lld(command: list, link_on_host) -> tuple[int, str]:
    """Run LLD `command` (as timings.run_tool does: exit code and messages, its CPU time counted
    to the phase being recorded) through this process's server for its executable, else
    directly. `link_on_host(objects) -> library` links the preloaded library."""
    server = _server_for(command, link_on_host)
    done = server.run(command) if server is not None else None
    if done is None:
        if server is not None:
            _forget(server)
        return timings.run_tool(command)
    returncode, messages, cpu, ended = done
    timings.count_tool_cpu(cpu)
    if ended:  # LLD's state was lost (a fatal error or a crash): the next link starts another server
        _retire(server)
    return returncode, messages


def _server_for(command: list, link_on_host) -> _Server | None:
    if not sys.platform.startswith("linux") or not os.path.isabs(command[0]) or not hasattr(os, "memfd_create"):
        return None
    executable = os.path.realpath(command[0])
    key = (os.getpid(), executable)  # a forked build worker starts its own
    with _servers_lock:
        if key not in _servers:
            shim = _shim(link_on_host)
            try:
                _servers[key] = _Server(executable, shim) if shim is not None else None
            except OSError:
                _servers[key] = None
        return _servers[key]


def _retire(server: _Server) -> None:
    with _servers_lock:
        for key, known in list(_servers.items()):
            if known is server:
                del _servers[key]
    server.close()


def _forget(server: _Server) -> None:
    with _servers_lock:
        for key, known in list(_servers.items()):
            if known is server:
                _servers[key] = None
    server.close()


def close_servers() -> None:
    """End this process's LLD servers (the next link starts one again)."""
    with _servers_lock:
        mine = [key for key in _servers if key[0] == os.getpid()]
        servers = [_servers.pop(key) for key in mine]
    for server in servers:
        if server is not None:
            server.close()


atexit.register(close_servers)
