"""A TensorBoard of one's own for a while: for notebooks, screenshots and the tests.

>>> with serve("runs/demo/logs") as url:
...     print(url)   # http://127.0.0.1:PORT, once the Attention tab has data
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port():
    """A port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve(log_dir, timeout=120):
    """Run `tensorboard --logdir log_dir` on a free port of 127.0.0.1; yields its URL, then stops it by its pid.

    Yields once TensorBoard lists the Attention tab as enabled (it has read
    attention summaries); a TimeoutError after `timeout` seconds otherwise.
    """
    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "tensorboard"), "--logdir", str(log_dir), "--host", "127.0.0.1",
         "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while not _attention_enabled(url):
            if time.time() > deadline or server.poll() is not None:
                raise TimeoutError(f"TensorBoard on {log_dir} did not show the Attention tab within {timeout} s")
            time.sleep(0.5)
        yield url
    finally:
        os.kill(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _attention_enabled(url):
    try:
        with urllib.request.urlopen(f"{url}/data/plugins_listing", timeout=5) as answer:
            return json.load(answer).get("attention", {}).get("enabled", False)
    except OSError:
        return False
