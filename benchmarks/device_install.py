"""What a device installs to run a builtin LiteRT export: site-packages of a fresh venv, as docs/on-device.md says.

    python benchmarks/device_install.py [--keep DIR]

Builds venvs in a temporary directory (pip from the package index, so it
needs the index) and prints one JSON line each: the megabytes (MiB and MB)
of site-packages, pip's and setuptools' own files left out (they come with
every venv), and the largest packages.

- `as documented`: `pip install --no-deps keras-transformer`, then
  `pip install ai-edge-litert sentencepiece tokenizers numpy` (every
  dependency of each);
- `wordpiece, lean`: a WordPiece run's needs, `tokenizers` with
  `--no-deps` (it imports its hub client only to download);
- `sentencepiece, lean`: a SentencePiece run's (no `tokenizers`).

Each venv then imports `keras_transformer.on_device` and checks that no
TensorFlow, tensorflow-text or Keras is there.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
VENV_TOOLING = ("pip", "setuptools", "pkg_resources", "_distutils_hack", "distutils-precedence.pth")
INSTALLS = {
    "as documented": [["ai-edge-litert", "sentencepiece", "tokenizers", "numpy"]],
    "wordpiece, lean": [["ai-edge-litert", "numpy"], ["--no-deps", "tokenizers"]],
    "sentencepiece, lean": [["ai-edge-litert", "sentencepiece", "numpy"]],
}
CHECK = ("import importlib.util, keras_transformer.on_device; "
         "assert all(importlib.util.find_spec(name) is None for name in ('tensorflow', 'tensorflow_text', 'keras'))")


def site_packages(venv):
    lib = os.path.join(venv, "lib")
    return os.path.join(lib, os.listdir(lib)[0], "site-packages")


def size(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names
               if not os.path.islink(os.path.join(root, name)))


def measure(name, steps, directory):
    venv = os.path.join(directory, name.replace(" ", "").replace(",", "-"))
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pip = [os.path.join(venv, "bin", "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--no-deps", ROOT], check=True)
    for arguments in steps:
        subprocess.run([*pip, *arguments], check=True)
    subprocess.run([os.path.join(venv, "bin", "python"), "-c", CHECK], check=True, cwd=directory)
    packages = site_packages(venv)
    sizes = {entry: size(os.path.join(packages, entry)) for entry in os.listdir(packages)
             if not entry.startswith(VENV_TOOLING) and entry != "__pycache__"}
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:6]
    return {"install": name, "site_packages_mib": round(total / 2**20, 1), "site_packages_mb": round(total / 1e6, 1),
            "largest_mib": {entry: round(value / 2**20, 1) for entry, value in largest}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", help="build the venvs here and keep them (default: a temporary directory)")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        directory = arguments.keep or temporary
        os.makedirs(directory, exist_ok=True)
        for name, steps in INSTALLS.items():
            print(json.dumps(measure(name, steps, directory)), flush=True)


if __name__ == "__main__":
    main()
