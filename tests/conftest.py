"""Shared test helpers: the CLI run in this process; NaN-poisoned Triton kernel outputs; kernel modules rebuilt
for the Triton interpreter; relative error; ``evalsuite serve`` in a subprocess and plain HTTP to it."""

import importlib
import math
import os
import sys
import threading

import pytest


def pytest_configure(config):
    """The kernel tests run the Triton kernels under the interpreter, set here before any test module imports triton:
    triton's own jit'd library functions (tl.sum's combine, ...) and our kernels follow the setting when they are
    built, and importing a model family's package builds its one-token Triton step (interpreted_kernel_modules
    checks). A run of the GPU tests alone (``pytest -m gpu``, tests/gpu) compiles the kernels for the GPU instead.
    Under pytest-xdist each worker's torch takes its share of the cores, so that the timing tests of one worker
    (``bench generate``'s two-call rate) are not at the mercy of the other's threads."""
    if config.getoption("markexpr").strip() != "gpu":
        os.environ["TRITON_INTERPRET"] = "1"
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:  # pytest -n: the workers share the cores; each torch's own thread pool would oversubscribe them
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


@pytest.fixture
def run_cli(monkeypatch, capsys):
    """``run_cli(args, cwd) -> (exit status, stdout, stderr)``: the console entry point, in this process."""
    from evalsuite import cli as cli_module

    def run(args, cwd):
        monkeypatch.chdir(cwd)
        monkeypatch.setattr(sys, "argv", ["evalsuite", *map(str, args)])
        capsys.readouterr()
        try:
            cli_module.main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def assert_one_line_error(code: int, err: str, message: str) -> None:
    """Exit status 2 and exactly one stderr line, ``error: ...`` containing ``message``."""
    assert code == 2, err
    assert err.startswith("error: ") and message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


KERNEL_GUARD = 512  # NaN elements on each side of every poisoned kernel output


@pytest.fixture
def poisoned_kernel_outputs(monkeypatch):
    """Every buffer a Triton kernel writes (``triton_utils.empty``) starts as NaN, between NaN guard bands of
    :data:`KERNEL_GUARD` elements: an element a kernel never writes, or a read past either end, shows up as NaN."""
    import torch

    from evalsuite.kernels import triton_utils

    def nan_empty(shape, dtype, device):
        n = math.prod(shape)
        flat = torch.full((n + 2 * KERNEL_GUARD,), float("nan"), dtype=dtype, device=device)
        return flat[KERNEL_GUARD : KERNEL_GUARD + n].view(shape)

    monkeypatch.setattr(triton_utils, "empty", nan_empty)


# The GCA kernels, one per module (test_gca_kernel.py, test_bench_gca.py).
GCA_KERNELS = {
    "evalsuite.kernels.jit_helpers": "mm",
    "common": "_load_tile",
    "backward": "_bwd_kernel",
    "forward": "_fwd_kernel",
}


def interpreted_kernel_modules(package: str, kernels: dict) -> dict:
    """``{name: package.<name>}`` (a dotted name: that module) for every name of ``kernels``, checked to be built for
    the Triton interpreter (``TRITON_INTERPRET=1``, set above before any import of triton). ``kernels[name]`` is a
    kernel of that module, or None for a module that only binds other modules' kernels."""
    modules = {name: importlib.import_module(name if "." in name else f"{package}.{name}") for name in kernels}
    compiled = [
        f"{n}.{k}" for n, k in kernels.items() if k and type(getattr(modules[n], k)).__name__ != "InterpretedFunction"
    ]
    assert not compiled, f"kernels built before TRITON_INTERPRET=1 was set: {compiled}"
    return modules


def rel_err(out, ref) -> float:
    """``|out - ref| / |ref|`` (Frobenius, float64; the absolute error when ref is zero); out must be finite."""
    out, ref = out.double(), ref.double()
    assert out.isfinite().all(), "non-finite values (unwritten or overflowed)"
    den = ref.norm()
    return ((out - ref).norm() / den).item() if den > 0 else (out - ref).norm().item()


# -- `evalsuite serve` in a subprocess, and plain HTTP on 127.0.0.1 ------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body=None, raw: bytes | None = None, timeout: float = 60.0):
    """``(status, parsed JSON or text, headers)`` of one request (stdlib only; error statuses are returned)."""
    import json
    import urllib.error
    import urllib.request

    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, text, headers = response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as e:
        status, text, headers = e.code, e.read().decode(), dict(e.headers)
    try:
        return status, json.loads(text), headers
    except ValueError:
        return status, text, headers


class ServeProcess:
    """``evalsuite serve --model MODEL`` on a free port of 127.0.0.1, ready when ``/health`` answers. ``env``:
    changes to the environment it inherits (a value None removes the variable), for a server timed as it runs."""

    def __init__(self, model: str, *args: str, env: dict[str, str | None] | None = None):
        import os
        import subprocess
        import tempfile

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.url}/v1"
        self.log = tempfile.TemporaryFile("w+")  # the server's output, shown when it fails
        cmd = [sys.executable, "-m", "evalsuite.cli", "serve", "--model", model, "--port", str(self.port),
               "--device", "cpu", "--log-level", "warning", *args]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        env = {k: v for k, v in env.items() if v is not None}
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout: float = 120.0) -> "ServeProcess":
        import time
        import urllib.error

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"evalsuite serve exited with {self.proc.returncode}: {self.output()}")
            try:
                if http("GET", f"{self.url}/health", timeout=2)[0] == 200:
                    return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"evalsuite serve did not become ready: {self.output()}")

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def stop(self) -> None:
        import subprocess

        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def served_fox():
    """``evalsuite serve --model fox-pro-tiny`` for the whole test run (test_serve.py, test_openai_adapter.py)."""
    server = ServeProcess("fox-pro-tiny").wait_ready()
    yield server
    server.stop()


class LocalHTTPServer:
    """A scripted stand-in for an HTTP API: ``handler`` (a ``BaseHTTPRequestHandler`` class) served on a free port
    of 127.0.0.1 from a background thread while the ``with`` block runs; ``base_url`` ends in ``/v1``."""

    def __init__(self, handler):
        from http.server import ThreadingHTTPServer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
