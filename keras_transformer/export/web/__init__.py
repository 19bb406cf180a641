"""A run as a static web page that answers offline: `export RUN OUT --format web`.

    OUT/index.html, app.js, tokenizers.js, node-builtins.js
                                 the page (`page/`): a text box, and `?text=` for scripts
    OUT/model.tflite, litert.json, source/, target/ (or text/)
                                 a builtin LiteRT file (`export.litert`, `ops="builtin"`) and its tokenizers
    OUT/vendor/                  LiteRT.js (`@litertjs/core`) and the tokenizers' library: Hugging Face's
                                 tokenizers port for WordPiece, SentencePiece's WebAssembly build
                                 (`@sctg/sentencepiece-js`) for SentencePiece

The page runs the file on LiteRT.js's WebAssembly build, which takes inputs of
fixed shapes only: the file takes one text at a time (`fixed_rows=1`), its
pieces padded to the model's length, with the whole search inside, as on a
phone. Its tokenizers run from the files `device_tokenizers` runs in
Python; a SentencePiece side also gets `surfaces.json`, the text each id
adds when decoded, as the Python runner works it out from the model. The
JavaScript packages come from npm when the page is written, as
`page/package-lock.json` pins them (installed once into a cache,
`page_packages`); the page fetches nothing from any other site.
"""

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from keras_transformer import device_tokenizers
from keras_transformer.export import litert
from keras_transformer.on_device import SETTINGS_FILE
from keras_transformer.saving import first_line, write_json

PAGE = Path(__file__).with_name("page")
PAGE_FILES = ("index.html", "app.js", "tokenizers.js", "node-builtins.js")
# What the page needs of each package: (package, file in it, where it goes under OUT/vendor/). LiteRT.js
# loads the WebAssembly build the browser can run: with relaxed SIMD, or the compatible one.
VENDORED = [
    ("@litertjs/core", "dist/index.js", "litertjs-core/index.js"),
    *[("@litertjs/core", f"wasm/{name}", f"litertjs-core/wasm/{name}")
      for name in ("litert_wasm_internal.js", "litert_wasm_internal.wasm", "litert_wasm_compat_internal.js",
                   "litert_wasm_compat_internal.wasm")],
    ("@litertjs/wasm-utils", "dist/index.js", "litertjs-wasm-utils/index.js"),
]
# Each kind of tokenizer's library (`litert.json`'s "kind"), vendored where a side needs it.
VENDORED_TOKENIZERS = {
    "wordpiece": [("@huggingface/tokenizers", "dist/tokenizers.min.mjs", "tokenizers/tokenizers.min.mjs"),
                  ("@huggingface/tokenizers", "LICENSE", "tokenizers/LICENSE")],
    "sentencepiece": [("@sctg/sentencepiece-js", "dist/index.js", "sentencepiece/index.js"),
                      ("@sctg/sentencepiece-js", "LICENSE", "sentencepiece/LICENSE")],
}
SURFACES_FILE = "surfaces.json"  # a SentencePiece side's: the text each of its ids adds when decoded


def check_service(service):
    """A one-line ValueError unless the page can run `service`: a builtin file of fixed rows."""
    if service.ops != "builtin" or not service.fixed_rows:
        raise ValueError("a web page runs a builtin LiteRT file of fixed rows (LiteRT.js takes no other)")


def page_packages(page=PAGE):
    """The page's npm packages, installed from `page/package-lock.json` once: their `node_modules` directory.

    `page`: the directory with `package.json` and `package-lock.json` (the
    benchmark's transformers.js page has its own). Kept in
    `$KERAS_TRANSFORMER_CACHE` (default `~/.cache/keras-transformer`) under
    the lockfile's digest: a new pin installs afresh. A ValueError of one
    line where npm is missing or cannot install them.
    """
    lockfile = (Path(page) / "package-lock.json").read_bytes()
    cache = Path(os.environ.get("KERAS_TRANSFORMER_CACHE", Path.home() / ".cache" / "keras-transformer"))
    installed = cache / f"web-{hashlib.sha256(lockfile).hexdigest()[:16]}"
    if (installed / "node_modules").is_dir():
        return installed / "node_modules"
    npm = shutil.which("npm")
    if npm is None:
        raise ValueError("--format web takes LiteRT.js from npm once: install Node.js and npm, then export again")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as partial:
        for name in ("package.json", "package-lock.json"):
            shutil.copy(Path(page) / name, partial)
        try:
            result = subprocess.run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--silent"],
                                    cwd=partial, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            raise ValueError("npm could not install the page's packages in 10 minutes: is the npm registry "
                             "reachable?") from None
        if result.returncode != 0:
            raise ValueError(f"npm could not install the page's packages: {first_line(result.stderr or result.stdout)}")
        shutil.rmtree(installed, ignore_errors=True)  # a cache left without its node_modules
        try:
            os.rename(partial, installed)  # whole, or not at all (another export may have won the race)
        except OSError:
            pass
        os.makedirs(partial, exist_ok=True)  # for the temporary directory's own cleanup
    if not (installed / "node_modules").is_dir():
        raise ValueError(f"npm installed the page's packages, yet {installed / 'node_modules'} is missing")
    return installed / "node_modules"


def main():
    """`python -m keras_transformer.export.web`: install the page's packages now (`make test` does), or one line why not."""
    import sys

    try:
        print(f"the web page's npm packages: {page_packages()}")
    except ValueError as error:
        sys.exit(f"make: {error}")


def write_surfaces(export_dir, recorded):
    """Write a SentencePiece side's `surfaces.json`: the text each id adds when decoded, as the Python runner has it.

    `recorded`: the side's entry in `litert.json`. The page decodes with
    this list alone (`page/tokenizers.js`): working it out takes lookups
    SentencePiece's WebAssembly build does not offer.
    """
    surfaces = device_tokenizers.load(export_dir, recorded).surfaces
    write_json(Path(export_dir) / recorded["directory"] / SURFACES_FILE, surfaces)


def export_web(service, out_dir, quantization=None, held_out_texts=None):
    """Write `service` (a builtin LiteRT service of fixed rows, e.g. `LiteRTTranslation(..., "builtin", 1)`) as a page.

    `out_dir` is new: refused if it exists, written whole or not at all.
    Returns `out_dir`.
    """
    litert.check_request(out_dir, quantization, "builtin")
    check_service(service)
    packages = page_packages()  # before the model is converted: a missing npm costs nothing

    def write_page(directory):
        for name in PAGE_FILES:
            shutil.copy(PAGE / name, directory)
        with open(Path(directory) / SETTINGS_FILE, encoding="utf-8") as file:
            sides = json.load(file)["tokenizers"].values()
        kinds = sorted({recorded["kind"] for recorded in sides})
        for package, source, target in VENDORED + [entry for kind in kinds for entry in VENDORED_TOKENIZERS[kind]]:
            path = Path(directory) / "vendor" / target
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(packages / package / source, path)
        for recorded in sides:
            if recorded["kind"] == "sentencepiece":
                write_surfaces(directory, recorded)

    return litert.export_litert(service, out_dir, quantization, held_out_texts, beside=write_page)
