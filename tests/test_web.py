"""`export --format web`: a static page that answers offline, driven in headless Chromium over loopback."""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import built_once
from helpers import cli_here
from test_attention_explorer import browser
from test_on_device import CLASSIFIER_TEXTS, PROMPTS, SENTENCES

from keras_transformer.on_device import LiteRTModel


@pytest.fixture(scope="session")
def web_pages(litert_exports, classifier_exports, language_model_export, tmp_path_factory):
    """The demo run's page (greedy), the classifier's and the language model's, each written by the command."""
    run, _ = litert_exports
    classifier, _ = classifier_exports
    language_model, _ = language_model_export

    def export(directory):
        printed = {}
        for name, source, options in (("translation", run, ["--beam-size", "1"]), ("classifier", classifier / "run", []),
                                      ("language-model", language_model, [])):
            printed[name] = cli_here("export", source, directory / name, "--format", "web", *options).stdout
        return printed

    directory, printed = built_once(tmp_path_factory, "web-pages", export)
    return Path(directory), printed


@contextlib.contextmanager
def served(directory):
    """`python -m http.server` on a free loopback port, serving `directory`: its address."""
    server = subprocess.Popen([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory",
                               str(directory)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = server.stdout.readline()  # "Serving HTTP on 127.0.0.1 port 41235 (http://127.0.0.1:41235/) ..."
        address = line.split("(")[1].split(")")[0].rstrip("/")
        for _ in range(100):
            with contextlib.suppress(OSError):
                urllib.request.urlopen(address, timeout=1).close()
                break
            time.sleep(0.1)
        yield address
    finally:
        server.terminate()
        server.wait(timeout=10)


def answers_of_the_page(directory, lines):
    """`(answers, requested)`: what the page writes into #translations for `?text=` (one a line), and every URL it asked for."""
    from playwright.sync_api import sync_playwright

    with served(directory) as address, sync_playwright() as playwright:
        chromium = browser(playwright)
        page = chromium.new_page(viewport={"width": 1000, "height": 800})
        requested, problems = [], []
        page.on("request", lambda request: requested.append(request.url))
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.goto(f"{address}/?text=" + urllib.parse.quote("\n".join(lines)))
        page.wait_for_function("['done', 'failed'].includes(document.body.dataset.state)", timeout=180_000)
        state, status = page.evaluate("document.body.dataset.state"), page.inner_text("#status")
        answers = page.eval_on_selector("#translations", "element => element.textContent").split("\n")
        chromium.close()
    assert state == "done" and not problems, (status, problems)
    assert all(url.startswith(address) for url in requested), [url for url in requested if not url.startswith(address)]
    return answers, requested


@pytest.mark.slow
def test_the_page_translates_held_out_sentences_as_the_litert_file_does_fetching_nothing_else(web_pages,
                                                                                            litert_exports):
    pages, printed = web_pages
    out = pages / "translation"
    assert printed["translation"].splitlines() == [
        f"exported web page: {out}",
        f"try it:     python -m http.server --directory {out} 8000, then open http://127.0.0.1:8000/"]
    assert len(SENTENCES) >= 50
    answers, requested = answers_of_the_page(out, SENTENCES)
    _, exports = litert_exports
    assert answers == LiteRTModel(exports / "builtin-greedy").translate(SENTENCES)
    assert any(url.endswith("/model.tflite") for url in requested)
    # The page's own file runs in Python too, one text at a time, as the page runs it.
    assert LiteRTModel(out).translate(SENTENCES[:8]) == answers[:8]


@pytest.mark.slow
def test_the_classifier_page_classifies_and_the_language_models_continues(web_pages, classifier_exports,
                                                                         language_model_export):
    pages, _ = web_pages
    classifier, _ = classifier_exports
    answers, _ = answers_of_the_page(pages / "classifier", CLASSIFIER_TEXTS)
    expected = LiteRTModel(classifier / "builtin").classify(CLASSIFIER_TEXTS)
    assert answers == ["" if label is None else f"{label}\t{probability:.4f}" for label, probability in expected]
    _, language_model = language_model_export
    answers, _ = answers_of_the_page(pages / "language-model", PROMPTS)
    # The export's settings and seed 0, a prompt at a time as the page asks (a draw depends on the batch's rows).
    builtin = LiteRTModel(language_model.with_name("builtin"))
    assert answers == [builtin.run([prompt])["text"][0].decode() for prompt in PROMPTS]


def test_without_npm_the_page_is_refused_in_one_line_and_nothing_is_written(trained_demo_run, tmp_path, monkeypatch):
    run, _ = trained_demo_run
    monkeypatch.setenv("KERAS_TRANSFORMER_CACHE", str(tmp_path / "cache"))  # nothing installed yet
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))  # no npm on it
    result = cli_here("export", run, tmp_path / "page", "--format", "web", check=False)
    assert result.returncode != 0 and result.stderr.strip().splitlines() == [
        "keras-transformer: error: --format web takes LiteRT.js from npm once: install Node.js and npm, then export "
        "again"], result.stderr
    assert not (tmp_path / "page").exists()


@pytest.mark.slow
def test_a_sentencepiece_runs_page_translates_held_out_sentences_as_its_litert_file(sentencepiece_run, tmp_path):
    out = tmp_path / "page"
    cli_here("export", sentencepiece_run, out, "--format", "web", "--beam-size", "1")
    # Only its own tokenizer's library goes in: SentencePiece's WebAssembly build.
    assert sorted(path.name for path in (out / "vendor").iterdir()) == [
        "litertjs-core", "litertjs-wasm-utils", "sentencepiece"]
    answers, requested = answers_of_the_page(out, SENTENCES)
    assert answers == LiteRTModel(out).translate(SENTENCES)
    assert len(set(answers)) > 3  # a model that tells sentences apart
    # Each side fetches what it uses: the source side reads text into ids, the target side writes ids as text.
    fetched = sorted("/".join(url.rsplit("/", 2)[1:]) for url in requested if "/source/" in url or "/target/" in url)
    assert fetched == ["source/sentencepiece.model", "source/tokenizer.json", "source/vocab.json",
                       "target/surfaces.json", "target/tokenizer.json"], fetched


# A Node.js script: the page's tokenizers.js, loaded as the page loads it, on each side named on the
# command line (a directory with `side.json`: litert.json's entry, the texts and the rows of ids to
# decode), printing each side's ids and text as JSON.
TOKENIZE_IN_NODE = """
import {readFileSync} from "node:fs";
import {loadTokenizer} from "./tokenizers.js";

const answers = [];
for (const directory of process.argv.slice(2)) {
  const read = {json: async (path) => JSON.parse(readFileSync(`${directory}/${path}`, "utf8")),
                bytes: async (path) => new Uint8Array(readFileSync(`${directory}/${path}`))};
  const {recorded, texts, rows} = await read.json("side.json");
  const tokenizer = await loadTokenizer(recorded, read);
  answers.push({ids: texts.map((text) => tokenizer.pieces(text)), texts: rows.map((row) => tokenizer.text(row))});
}
console.log(JSON.stringify(answers));
"""


def test_the_pages_sentencepiece_reads_and_writes_every_checkpoint_familys_text_as_the_python_runner(tmp_path):
    """Marian (`>>xx<<` codes), M2M100 and NLLB (word by word): the page's tokenizers in Node.js, against Python's."""
    import numpy as np
    from test_pretrained import FIXTURES

    from keras_transformer import device_tokenizers, pretrained
    from keras_transformer.export import web
    from keras_transformer.export.litert import PROBE_SENTENCES, device_text
    from keras_transformer.pretrained.checkpoint import read_config

    texts = SENTENCES + PROBE_SENTENCES + [">>fra<< A dog.", ">>xx<<", " lead", "a  b   c", "\ufb01ne \uff46ull \u0007",
                                           "<unk> </s> __en__ eng_Latn"]
    rng = np.random.default_rng(0)
    sides, expected = [], []
    for name in ("marian-shared-swish", "marian-separate-relu", "m2m100-en-de", "nllb-en-de"):
        config = read_config(str(FIXTURES / name))
        for side, tokenizer in zip(("source", "target"), pretrained.family_of(config).tokenizers(str(FIXTURES / name),
                                                                                                  config)):
            directory = tmp_path / f"{name}-{side}"
            recorded = device_text.write_tokenizer(tokenizer, str(directory), "side")
            recorded["directory"] = "side"
            web.write_surfaces(directory, recorded)
            python = device_tokenizers.load(str(directory), recorded)
            ids = python.pieces(texts)
            # Rows of ids as a search writes them: any id, special ones and out-of-range ones included.
            rows = ids + [rng.integers(-1, len(python.surfaces) + 1, rng.integers(0, 12)).tolist()
                          for _ in range(100)]
            (directory / "side.json").write_text(json.dumps({"recorded": recorded, "texts": texts, "rows": rows}))
            sides.append(directory)
            expected.append({"ids": ids, "texts": [python.text(row) for row in rows]})
    shutil.copy(web.PAGE / "tokenizers.js", tmp_path)
    (tmp_path / "node_modules").symlink_to(web.page_packages())  # as the page's import map names them
    (tmp_path / "drive.mjs").write_text(TOKENIZE_IN_NODE)
    node = subprocess.run(["node", "drive.mjs", *map(str, sides)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert node.returncode == 0, node.stderr
    answers = json.loads(node.stdout)
    for directory, theirs, ours in zip(sides, answers, expected):
        assert theirs["ids"] == ours["ids"], directory.name
        assert theirs["texts"] == ours["texts"], directory.name
