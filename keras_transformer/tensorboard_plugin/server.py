"""A TensorBoard of one's own for a while: for notebooks, screenshots and the tests.

>>> with serve("runs/demo/logs") as url:
...     print(url)   # http://127.0.0.1:PORT, once the Attention tab has data
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


@contextlib.contextmanager
def serve(log_dir, timeout=120, ready=None):
    """Run `tensorboard --logdir log_dir` on 127.0.0.1; yields its URL, then stops it by its pid.

    TensorBoard binds a port the system picks (`--port 0`) and names it in its
    start-up line: choosing a free port first and handing it over would leave a
    moment in which another process could take it. Yields once `ready(url)`
    holds (by default: the Attention tab is enabled, so attention summaries were
    read). A RuntimeError with its last line of output if it exits first; a
    TimeoutError after `timeout` seconds.
    """
    ready = ready or _attention_enabled
    with tempfile.TemporaryFile("w+", encoding="utf-8") as log:
        server = subprocess.Popen(
            [str(Path(sys.executable).parent / "tensorboard"), "--logdir", str(log_dir), "--host", "127.0.0.1",
             "--port", "0"],
            stdout=subprocess.DEVNULL, stderr=log,
        )
        try:
            deadline = time.time() + timeout
            url = None
            while url is None or not ready(url):
                if server.poll() is not None:
                    log.seek(0)
                    last_line = (log.read().strip().splitlines() or ["no output"])[-1]
                    raise RuntimeError(f"TensorBoard on {log_dir} exited with status {server.returncode}: {last_line}")
                if time.time() > deadline:
                    raise TimeoutError(f"TensorBoard on {log_dir} was not ready within {timeout} s")
                time.sleep(0.5)
                if url is None:
                    log.seek(0)
                    url = _serving_url(log.read())
            yield url
        finally:
            os.kill(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def _serving_url(start_up_output):
    """The URL in TensorBoard's "TensorBoard 2.x at http://127.0.0.1:PORT/ (Press CTRL+C to quit)", or None."""
    found = re.search(r"TensorBoard \S+ at (http://127\.0\.0\.1:\d+)", start_up_output)
    return found.group(1) if found else None


def _attention_enabled(url):
    try:
        with urllib.request.urlopen(f"{url}/data/plugins_listing", timeout=5) as answer:
            return json.load(answer).get("attention", {}).get("enabled", False)
    except OSError:
        return False
