"""Generated kernel projects, the `qdc` command in-process, and an S3-compatible server for
the sharded-build and remote-store tests (fixtures `s3_server` and `store_url`: a test module
imports them by name)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from click.testing import CliRunner

from qdc.cli.main import cli
from qdc.runtime import remote as R

try:
    import obstore  # noqa: F401  (the `remote` extra; `make test` installs it)
    HAVE_OBSTORE = True
except ImportError:
    HAVE_OBSTORE = False
needs_obstore = pytest.mark.skipif(not HAVE_OBSTORE, reason="the remote extra (obstore) is not installed")

MODULE_TEMPLATE = '''import qdc as qd

values = qd.field(qd.f32, shape={n}, needs_grad=True)
total = qd.field(qd.f32, shape=(), needs_grad=True)
'''
KERNEL_TEMPLATE = '''

@qd.kernel
def k{i}(a: qd.f32, xs: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for j in values:
        values[j] = xs[j] * a + {offset}.0
    for j in values:
        total[None] += values[j] * values[j]
'''


def write_project(folder, modules: int = 2, kernels: int = 3, n: int = 16) -> str:
    """A folder of `modules` kernel files, each with `kernels` kernels (and their gradients):
    mod<m>.k<i>(a, xs) sets values = xs * a + 10 * m + i and adds sum(values**2) to total."""
    os.makedirs(folder, exist_ok=True)
    for m in range(modules):
        text = MODULE_TEMPLATE.format(n=n) + "".join(KERNEL_TEMPLATE.format(i=i, offset=10 * m + i) for i in range(kernels))
        with open(os.path.join(folder, f"mod{m}.py"), "w", encoding="utf-8") as f:
            f.write(text)
    return str(folder)


def qdc(*args, ok: bool = True):
    """Run `qdc ARGS` in this process: the click Result (stdout and stderr apart)."""
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    if ok and result.exit_code != 0:
        raise AssertionError(f"qdc {' '.join(map(str, args))} exited {result.exit_code}:\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


def tree(folder) -> dict:
    """Relative path -> bytes of every file under `folder` (last_use stamps aside)."""
    out = {}
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            if name != "last_use":
                path = os.path.join(dirpath, name)
                with open(path, "rb") as f:
                    out[os.path.relpath(path, folder)] = f.read()
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """`moto_server` on 127.0.0.1 (or the server of QDC_TEST_S3_ENDPOINT), its environment for
    obstore, and a fresh bucket per test."""

    def __init__(self):
        self.proc = None
        endpoint = os.environ.get("QDC_TEST_S3_ENDPOINT")
        if endpoint:
            self.endpoint, self.env = endpoint, {}
            self.bucket = os.environ.get("QDC_TEST_S3_BUCKET", "qdc-test")
            return
        exe = shutil.which("moto_server")
        if exe is None:
            raise RuntimeError("moto_server is not installed (pip install 'moto[server]')")
        port = free_port()
        self.proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.endpoint = f"http://127.0.0.1:{port}"
        self.env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1"}
        self.bucket = None
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(self.endpoint, timeout=1)
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto_server did not start")
                time.sleep(0.2)

    def environment(self) -> dict:
        return {**self.env, "AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true"}

    def new_url(self, name: str) -> str:
        """A URL of a prefix no test used before; on moto, in a bucket of its own."""
        if self.bucket is not None:
            return f"s3://{self.bucket}/{name}-{os.getpid()}-{time.time_ns()}"
        bucket = f"qdc-{time.time_ns()}"
        request = urllib.request.Request(f"{self.endpoint}/{bucket}", method="PUT")
        urllib.request.urlopen(request, timeout=10)
        return f"s3://{bucket}/{name}"

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


def run_qdc_process(args, env=None, **kwargs) -> subprocess.Popen:
    """`qdc ARGS` in a process of its own."""
    return subprocess.Popen([sys.executable, "-m", "qdc.cli.main", *map(str, args)], env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


@pytest.fixture(scope="module")
def s3_server():
    try:
        server = S3Server()
    except (RuntimeError, OSError) as e:
        pytest.skip(f"no S3-compatible server: {e}")
    yield server
    server.stop()


@pytest.fixture(params=["file", "s3"])
def store_url(request, tmp_path, monkeypatch):
    """A fresh, empty remote store's URL; the S3 server's environment is set for the test."""
    monkeypatch.setattr(R, "FIRST_BACKOFF_S", 0.01)
    if request.param == "file":
        return f"file://{tmp_path}/store"
    server = request.getfixturevalue("s3_server")
    for name, value in server.environment().items():
        monkeypatch.setenv(name, value)
    return server.new_url("store")
