"""The web page (`export --format web`) in headless Chromium: load time, the first answer, sentences/s.

    python benchmarks/web_page.py RUN_DIR [--sentences 64] [--quantization int8] [--beam-size 1] [--rounds 3]
    python benchmarks/web_page.py --opus-mt-base --against-transformers-js --onnx-python .venv-onnx/bin/python
    python benchmarks/web_page.py RUN_DIR --against-transformers-js --onnx-python ...   # a SentencePiece run

Writes the run's page into a temporary directory, serves it on loopback
(cross-origin isolated, so that a page may use threads) and opens it in
Debian's Chromium (headless, as the tests do) `--rounds` times, each a
fresh browser: the page's own figures (`data-load-ms`: the runtime and the
model loaded and compiled; `data-first-ms`: the first sentence's answer)
and the sentences per second over the first `--sentences` validation
sentences, one at a time as the page translates them. Prints one JSON line
a contender: each figure's median and every round's, the bytes the page
downloads, and whether every round's answers equal `translate --litert` on
the same file.

`--opus-mt-base` times an imported checkpoint of OPUS-MT-base's shape with
random weights (`litert.opus_mt_base_checkpoint`), on Multi30k's validation
sentences; `--max-output-length` caps the tokens each side writes (64:
random weights rarely end a sentence; by default, the run's own cap).

`--against-transformers-js` times the same weights the way the web
translates with Marian models today: transformers.js (ONNX Runtime Web),
given the checkpoint (`export --format hf` of the run, or the imported
one) as ONNX files made for this benchmark only
(`transformers_js/marian_for_transformers_js.py`, run by `--onnx-python`,
a Python with optimum-onnx, onnxslim and PyTorch), its q8 files (its default on
WebAssembly) against our int8 page, greedy, a sentence at a time, at each
of `--threads` (ONNX Runtime's threads; LiteRT.js's WebAssembly build runs
on one).
"""

import argparse
import contextlib
import functools
import http.server
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
TRANSFORMERS_JS = Path(HERE) / "transformers_js"
# What the transformers.js page serves of its npm packages: (package, file, where it goes under vendor/).
TRANSFORMERS_JS_FILES = [
    ("@huggingface/transformers", "dist/transformers.min.js", "transformers.min.js"),
    ("onnxruntime-web", "dist/ort-wasm-simd-threaded.asyncify.mjs", "ort-wasm-simd-threaded.asyncify.mjs"),
    ("onnxruntime-web", "dist/ort-wasm-simd-threaded.asyncify.wasm", "ort-wasm-simd-threaded.asyncify.wasm"),
]


class _IsolatedHandler(http.server.SimpleHTTPRequestHandler):
    """A static file server whose pages are cross-origin isolated (threads in WebAssembly need it)."""

    def end_headers(self):
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()

    def log_message(self, *arguments):
        pass


@contextlib.contextmanager
def served(directory):
    """`directory` served on a free loopback port: its address."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(_IsolatedHandler, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def page_round(address, sentences, query=""):
    """One fresh browser on the page with `?text=`: its figures, its answers, and the bytes it fetched."""
    from playwright.sync_api import sync_playwright

    fetched = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), headless=True,
                                             args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page()
        page.on("requestfinished", lambda request: fetched.append(request.sizes()["responseBodySize"]))
        started = time.perf_counter()
        page.goto(f"{address}/?{query}text=" + urllib.parse.quote("\n".join(sentences)))
        page.wait_for_function("['done', 'failed'].includes(document.body.dataset.state)", timeout=1_800_000)
        wall = time.perf_counter() - started
        figures = page.evaluate("({...document.body.dataset})")
        status = page.inner_text("#status")
        answers = page.eval_on_selector("#translations", "element => element.textContent").split("\n")
        browser.close()
    if figures["state"] != "done":
        raise SystemExit(f"the page at {address} failed: {status}")
    milliseconds = float(status.split(" in ")[1].split(" ms")[0])
    return {"load_ms": int(figures["loadMs"]), "first_ms": int(figures["firstMs"]),
            "sentences_per_s": round(len(sentences) / milliseconds * 1000, 2), "wall_s": round(wall, 2),
            "downloaded_bytes": sum(fetched), "isolated": figures.get("isolated") == "true", "words_per_answer": round(
                sum(len(answer.split()) for answer in answers) / len(answers), 1)}, answers


def timed(directory, sentences, rounds, query=""):
    """`(row, answers of each round)`: `rounds` fresh browsers on the page in `directory`, the figures' medians."""
    with served(directory) as address:
        measured = [page_round(address, sentences, query) for _ in range(rounds)]
    row = {name: statistics.median(figures[name] for figures, _ in measured)
           for name in ("load_ms", "first_ms", "sentences_per_s", "downloaded_bytes", "words_per_answer")}
    row["rounds"] = [figures for figures, _ in measured]
    return row, [answers for _, answers in measured]


def transformers_js_page(checkpoint, directory, onnx_python):
    """The transformers.js page of the Marian `checkpoint` written into `directory` (models/marian/: ONNX)."""
    from keras_transformer.export.web import page_packages

    packages = page_packages(TRANSFORMERS_JS)
    os.makedirs(os.path.join(directory, "vendor"))
    for name in ("index.html", "app.js"):
        shutil.copy(TRANSFORMERS_JS / name, directory)
    for package, source, target in TRANSFORMERS_JS_FILES:
        shutil.copy(packages / package / source, os.path.join(directory, "vendor", target))
    subprocess.run([onnx_python, str(TRANSFORMERS_JS / "marian_for_transformers_js.py"), checkpoint,
                    os.path.join(directory, "models", "marian")], check=True, stdout=subprocess.DEVNULL)
    # Only the q8 files: what a page of transformers.js's default downloads.
    for name in ("encoder_model.onnx", "decoder_model_merged.onnx"):
        os.remove(os.path.join(directory, "models", "marian", "onnx", name))


def same_source_ids(page, model, sentences):
    """How many of `sentences` the transformers.js model's `tokenizer.json` reads into our page's ids (Python's
    `tokenizers`, which reads the normaliser transformers.js approximates), the checkpoint's ids being ours - 1."""
    from tokenizers import Tokenizer

    from keras_transformer.on_device import LiteRTModel

    ours = LiteRTModel(page).tokenizers["source"].pieces(sentences)
    theirs = Tokenizer.from_file(os.path.join(model, "tokenizer.json")).encode_batch(sentences)
    return sum([index - 1 for index in mine] == their.ids[:-1] for mine, their in zip(ours, theirs))  # </s> last


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", nargs="?")
    parser.add_argument("--opus-mt-base", action="store_true", help="an imported checkpoint of OPUS-MT-base's shape")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--quantization", default="int8")
    parser.add_argument("--beam-size", type=int, default=1)
    parser.add_argument("--max-output-length", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against-transformers-js", action="store_true")
    parser.add_argument("--onnx-python", help="a Python with optimum-onnx and PyTorch (BENCHMARKS.md)")
    parser.add_argument("--threads", default="1,2", help="transformers.js's ONNX Runtime threads to time")
    arguments = parser.parse_args()
    if bool(arguments.run_dir) == arguments.opus_mt_base:
        parser.error("give RUN_DIR or --opus-mt-base")
    if arguments.against_transformers_js and not arguments.onnx_python:
        parser.error("--against-transformers-js needs --onnx-python")

    from keras_transformer.on_device import LiteRTModel
    from keras_transformer.runs import exporters, translation

    with tempfile.TemporaryDirectory() as directory:
        run_dir, checkpoint = arguments.run_dir, None
        if arguments.opus_mt_base:
            from litert import opus_mt_base_checkpoint

            checkpoint, run_dir = os.path.join(directory, "checkpoint"), os.path.join(directory, "run")
            os.makedirs(checkpoint)
            opus_mt_base_checkpoint(checkpoint)
            translation.import_checkpoint(checkpoint, run_dir)
            data = os.environ.get("KERAS_TRANSFORMER_DATA", os.path.join(HERE, "..", "..", "shared", "data"))
            with open(os.path.join(data, "multi30k", "val.en"), encoding="utf-8") as file:
                sentences = file.read().splitlines()[:arguments.sentences]
        else:
            config = translation.load_config(run_dir)
            sentences = [source for source, _ in
                         translation.load_pairs(config["data"], ("val",))["val"][:arguments.sentences]]
        out = os.path.join(directory, "page")
        exporters.export(run_dir, out, "web", quantization=arguments.quantization, beam_size=arguments.beam_size,
                         max_output_length=arguments.max_output_length)
        expected = LiteRTModel(out).translate(sentences)
        ours, answers = timed(out, sentences, arguments.rounds)
        ours.update(contender="our page (LiteRT.js)", sentences=len(sentences), quantization=arguments.quantization,
                    beam_size=arguments.beam_size, same_as_translate_litert=all(each == list(expected)
                                                                                for each in answers))
        print(json.dumps(ours), flush=True)
        if not arguments.against_transformers_js:
            return
        if checkpoint is None:
            checkpoint = os.path.join(directory, "checkpoint")
            exporters.export(run_dir, checkpoint, "hf")
        theirs_dir = os.path.join(directory, "transformers-js")
        transformers_js_page(checkpoint, theirs_dir, arguments.onnx_python)
        same_ids = same_source_ids(out, os.path.join(theirs_dir, "models", "marian"), sentences)
        # Each side writes at most as many tokens as the file does (transformers.js's pipeline would write 256);
        # ours also stops at the source's length plus the run's max_extra_length (`words_per_answer` shows both).
        max_new_tokens = LiteRTModel(out).settings["max_output_length"]
        for threads in map(int, arguments.threads.split(",")):
            theirs, their_answers = timed(theirs_dir, sentences, arguments.rounds,
                                          f"dtype=q8&threads={threads}&max_new_tokens={max_new_tokens}&")
            if threads > 1 and not all(figures["isolated"] for figures in theirs["rounds"]):
                raise SystemExit("the transformers.js page was not cross-origin isolated: it ran on one thread")
            theirs.update(contender="transformers.js (ONNX Runtime Web)", threads=threads, dtype="q8",
                          sentences=len(sentences), same_source_ids_as_our_page=same_ids, same_answers_as_our_page=sum(
                              mine == their for mine, their in zip(answers[0], their_answers[0])),
                          speed_ratio_ours=round(ours["sentences_per_s"] / theirs["sentences_per_s"], 2),
                          download_ratio_ours=round(ours["downloaded_bytes"] / theirs["downloaded_bytes"], 2))
            print(json.dumps(theirs), flush=True)


if __name__ == "__main__":
    main()
