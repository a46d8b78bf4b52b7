"""`vaswani-mt demo` as a user starts it, for the page's tests: a subprocess serving on a free port of 127.0.0.1,
stopped with Ctrl+C (SIGINT) afterwards. Nothing leaves the machine: the Hub is offline and Gradio's analytics and
version check are off (the page also sets analytics_enabled=False itself)."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

START_TIMEOUT = 180  # seconds: importing torch, transformers and gradio on a busy 2-core machine


def free_port() -> int:
    """A port of 127.0.0.1 that nothing listens on now (bound, read, released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _default_sigint() -> None:
    """In the child: Ctrl+C stops it even when this test process was started with SIGINT ignored (a background job
    of a shell), which the child would inherit and Python would then never turn into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def demo_env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "GRADIO_ANALYTICS_ENABLED": "False",
            "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


READY_LINE = "; Ctrl+C stops it"  # what `vaswani-mt demo` says once it serves


@contextlib.contextmanager
def serving(model: str | Path, log: Path, *extra: str, cwd: Path | None = None):
    """`vaswani-mt demo MODEL --port N` running until the block ends; yields (url, process). The page is ready when
    the command says so (its "Ctrl+C stops it" line: the server answers /config a moment before launch() returns,
    and a Ctrl+C then stops it while starting) and /config answers. Its stderr goes to `log`; it runs in `cwd`
    (default: the log's folder), where a relative MODEL is found."""
    port = free_port()
    with open(log, "w", encoding="utf-8") as stream:
        process = subprocess.Popen([sys.executable, "-m", "vaswani_mt.cli", "demo", str(model), "--port", str(port),
                                    *extra], stdout=stream, stderr=subprocess.STDOUT, env=demo_env(),
                                   cwd=cwd or log.parent, preexec_fn=_default_sigint)
        url = f"http://127.0.0.1:{port}/"
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while True:
                if process.poll() is not None:
                    raise AssertionError(f"vaswani-mt demo exited with {process.returncode}: {log.read_text()[-3000:]}")
                try:
                    if READY_LINE in log.read_text(encoding="utf-8", errors="replace"):
                        with urllib.request.urlopen(url + "config", timeout=5) as response:
                            if response.status == 200:
                                break
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(f"vaswani-mt demo did not answer in {START_TIMEOUT} s: {log.read_text()}")
                time.sleep(0.25)
            yield url, process
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)  # Ctrl+C, as a user stops it
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
