"""How our programs start TensorFlow: quietly, as a command-line tool should.

TensorFlow's C++ side prints several lines while it loads ("All log messages
before absl::InitializeLog()...", "oneDNN custom operations are on...",
"Could not find cuda drivers...") before TF_CPP_MIN_LOG_LEVEL applies, so
setting that variable alone does not silence them (a user who sets it to 3
still sees them all). The `keras-transformer`
command and the scripts in examples/ import TensorFlow through
`start_tensorflow_quietly`, so that their first lines of output are their own.
A program of the user's that imports the package is left as it is.

This module imports only the standard library: the package's `__init__`
uses it before TensorFlow is loaded.
"""

import contextlib
import importlib
import logging
import os
import re
import sys
import tempfile
from pathlib import Path

# What TensorFlow's C++ side prints while it starts, before its log level
# applies: the logger's preamble and INFO/WARNING lines ("I0000 ... oneDNN
# custom operations are on", "Could not find cuda drivers"); and, on a machine
# without a GPU, the ERROR line of the first look for one ("failed call to
# cuInit"), which levels below 3 let through.
_START_UP_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\)|[IW]\d{4} |E\d{4} .*failed call to cuInit)"
)

# The scripts beside the package in its repository: they start as the command does.
EXAMPLES_DIRECTORY = Path(__file__).resolve().parent.parent / "examples"


def is_an_example():
    """Whether this process runs one of the scripts in examples/."""
    script = (getattr(sys, "argv", None) or [""])[0]
    return bool(script) and Path(script).resolve().parent == EXAMPLES_DIRECTORY


@contextlib.contextmanager
def start_up_lines_dropped(noise):
    """Run the block with the lines matching `noise` that it writes to stderr dropped; the others are passed on.

    Native libraries write to the stderr file descriptor, not to
    `sys.stderr`: the descriptor is pointed at a file for the block, and what
    it caught is read back after.
    """
    sys.stderr.flush()
    saved_stderr = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved_stderr, 2)
            os.close(saved_stderr)
            captured.seek(0)
            for line in captured.read().decode("utf-8", errors="replace").splitlines():
                if not noise.match(line):
                    print(line, file=sys.stderr)


def start_tensorflow_quietly():
    """Import TensorFlow with no start-up chatter on the console, unless the user asked for its logs.

    The start-up lines are written to the stderr file descriptor while
    TensorFlow loads (and first looks for its devices): they are caught there,
    and all but those lines passed on. A user's TF_CPP_MIN_LOG_LEVEL is kept:
    0 asked for everything, and TensorFlow is left to print it; 1, 2 or 3 get
    the start-up lines filtered too, since TensorFlow prints them whatever the
    level, so that asking for quiet is never noisier than not asking.
    """
    if "tensorflow" in sys.modules or os.environ.get("TF_CPP_MIN_LOG_LEVEL", "").strip() == "0":
        return
    # 3 unless the user chose: not even ERROR lines, which on a machine without
    # a GPU include "failed call to cuInit"; a real failure still surfaces as an exception.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with start_up_lines_dropped(_START_UP_NOISE):
        for module in ("tensorflow", "keras", "tensorflow_text"):
            importlib.import_module(module)
        # The first look for devices logs "failed call to cuInit" on a machine without a GPU,
        # at ERROR, which levels 1 and 2 let through: it happens here, where it is caught.
        # Physical devices only: the logical ones (a CPU split into replicas) are still to configure.
        sys.modules["tensorflow"].config.list_physical_devices()
    # TensorFlow's Python side logs at INFO what a user did not ask about
    # ("Assets written to: ..." when saving); warnings still show.
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
