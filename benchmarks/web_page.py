"""The web page (`export --format web`) in headless Chromium: load time, the first answer, sentences/s.

    python benchmarks/web_page.py RUN_DIR [--sentences 64] [--quantization int8] [--beam-size 1] [--rounds 3]

Writes the run's page into a temporary directory, serves it with
`python -m http.server` on loopback, and opens it in Debian's Chromium
(headless, as the tests do) `--rounds` times, each a fresh browser: the
page's own figures (`data-load-ms`: LiteRT.js and the model loaded and
compiled; `data-first-ms`: the first sentence's answer) and the sentences
per second over the first `--sentences` validation sentences, one at a time
as the page translates them. Prints one JSON line: each figure's median and
every round's, the bytes the page downloads, and whether every round's
answers equal `translate --litert` on the same file.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))


def page_round(address, sentences):
    """One fresh browser on the page with `?text=`: its figures, its answers, and the bytes it fetched."""
    from playwright.sync_api import sync_playwright

    fetched = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), headless=True,
                                             args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page()
        page.on("requestfinished", lambda request: fetched.append(request.sizes()["responseBodySize"]))
        started = time.perf_counter()
        page.goto(f"{address}/?text=" + urllib.parse.quote("\n".join(sentences)))
        page.wait_for_function("['done', 'failed'].includes(document.body.dataset.state)", timeout=600_000)
        wall = time.perf_counter() - started
        figures = page.evaluate("({...document.body.dataset})")
        status = page.inner_text("#status")
        answers = page.eval_on_selector("#translations", "element => element.textContent").split("\n")
        browser.close()
    milliseconds = float(status.split(" in ")[1].split(" ms")[0])
    return {"load_ms": int(figures["loadMs"]), "first_ms": int(figures["firstMs"]),
            "sentences_per_s": round(len(sentences) / milliseconds * 1000, 2), "wall_s": round(wall, 2),
            "downloaded_bytes": sum(fetched)}, answers


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--quantization", default="int8")
    parser.add_argument("--beam-size", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()

    from keras_transformer.on_device import LiteRTModel
    from keras_transformer.runs import exporters, translation

    config = translation.load_config(arguments.run_dir)
    sentences = [source for source, _ in translation.load_pairs(config["data"], ("val",))["val"][:arguments.sentences]]
    with tempfile.TemporaryDirectory() as directory:
        out = os.path.join(directory, "page")
        exporters.export(arguments.run_dir, out, "web", quantization=arguments.quantization,
                         beam_size=arguments.beam_size)
        expected = LiteRTModel(out).translate(sentences)
        server = subprocess.Popen([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", out],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            address = server.stdout.readline().split("(")[1].split(")")[0].rstrip("/")
            rounds = [page_round(address, sentences) for _ in range(arguments.rounds)]
        finally:
            server.terminate()
    row = {name: statistics.median(figures[name] for figures, _ in rounds)
           for name in ("load_ms", "first_ms", "sentences_per_s", "downloaded_bytes")}
    row.update(rounds=[figures for figures, _ in rounds], sentences=len(sentences),
               quantization=arguments.quantization, beam_size=arguments.beam_size,
               same_as_translate_litert=all(answers == list(expected) for _, answers in rounds))
    print(json.dumps(row))


if __name__ == "__main__":
    main()
