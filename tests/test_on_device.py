"""A builtin LiteRT file (`export --format litert --ops builtin`): stock LiteRT and the host's tokenizers, no TensorFlow.

The device here is `.venv-device` (`make test` builds it as docs/on-device.md
tells a device to install): the package without its dependencies, LiteRT's
runtime, the tokenizer libraries and NumPy.
"""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import DOCUMENT, DOCUMENT_TEXTS, cli_here

from keras_transformer.data import demo_corpus
from keras_transformer.export import litert
from keras_transformer.on_device import LiteRTModel
from keras_transformer.runs import translation

ROOT = Path(__file__).resolve().parents[1]
DEVICE = Path(os.environ.get("KERAS_TRANSFORMER_DEVICE_VENV", ROOT / ".venv-device"))
# Held-out sentences of the demo run (its training read the first 40 validation pairs), and a phone user's.
SENTENCES = [source for source, _ in demo_corpus()["val"][40:100]] + [
    "", "The dog, the cat (and the bird) sleep!", "Tōkyō 東京 2024 🙂 café", "the " * 120, "A DOG's T-shirt [sic]",
]
# A language model continues a prompt from its last pieces: the last one is longer than the model reads.
PROMPTS = ["A dog", "The young cat sees", "", "Today", " ".join(source for source, _ in demo_corpus()["val"][:6])]


def on_the_device(script, *arguments, input=None):
    """Run `script` with the device's Python (no TensorFlow, no Keras): a `CompletedProcess`, checked."""
    python = DEVICE / "bin" / "python"
    assert python.exists(), f"{python} is missing: `make test` builds it (make .venv-device/.installed-stamp)"
    return subprocess.run([str(python), "-c", script, *map(str, arguments)], input=input, capture_output=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": ""})


# Every kind of run, on the device: nothing of TensorFlow or Keras is there, or loaded by the runner.
DEVICE_SCRIPT = """
import importlib.util, json, sys
assert all(importlib.util.find_spec(name) is None for name in ("tensorflow", "tensorflow_text", "keras"))
from keras_transformer.on_device import LiteRTModel
translation, classifier, language_model = sys.argv[1:4]
answers = {"translation": LiteRTModel(translation).translate(json.loads(sys.argv[4])),
           "labels": LiteRTModel(classifier).classify(json.loads(sys.argv[5])),
           "continuations": LiteRTModel(language_model).generate(json.loads(sys.argv[6]), seed=3)}
assert not [name for name in sys.modules if name.split(".")[0] in ("tensorflow", "keras")]
print(json.dumps(answers))
"""

CLASSIFIER_TEXTS = ["The FILM was Great.", "awful, boring ACTORS", "", "Ünïcode İstanbul ÉNORME " * 10, "x"]


@pytest.mark.slow
def test_a_device_without_tensorflow_translates_classifies_and_generates_as_the_text_files(
        litert_exports, classifier_exports, language_model_export):
    _, exports = litert_exports
    classifier, _ = classifier_exports
    _, language_model = language_model_export
    result = on_the_device(DEVICE_SCRIPT, exports / "builtin-greedy", classifier / "builtin",
                           language_model.with_name("builtin"), json.dumps(SENTENCES), json.dumps(CLASSIFIER_TEXTS),
                           json.dumps(PROMPTS))
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    answers = json.loads(result.stdout)
    assert answers["translation"] == LiteRTModel(exports / "greedy").translate(SENTENCES)
    text_classifier = LiteRTModel(classifier / "litert")
    assert [tuple(pair) if pair[0] else (None, None) for pair in answers["labels"]] == [
        (label, pytest.approx(probability, abs=1e-5)) if label else (None, None)
        for label, probability in text_classifier.classify(CLASSIFIER_TEXTS)]
    assert answers["continuations"] == LiteRTModel(language_model).generate(PROMPTS, seed=3)


@pytest.mark.slow
def test_the_device_command_line_answers_a_document_line_by_line(litert_exports):
    _, exports = litert_exports
    builtin = exports / "builtin-greedy"
    command = "import sys; from keras_transformer.cli import main; sys.argv[0] = 'keras-transformer'; main()"
    result = on_the_device(command, "translate", "--litert", builtin, input=DOCUMENT)
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    lines = result.stdout.decode().split("\n")
    expected = LiteRTModel(exports / "greedy").translate([text or "" for text in DOCUMENT_TEXTS])
    assert lines[:-1] == list(expected) and lines[-1] == ""
    stderr = result.stderr.decode()
    assert "line 4: bytes that are not UTF-8 were read as U+FFFD" in stderr
    assert "line 5 is longer than the model reads" in stderr
    assert len(stderr.splitlines()) == 2, stderr


@pytest.mark.slow
def test_builtin_files_translate_as_the_text_files_with_builtin_operators_only(litert_exports):
    _, exports = litert_exports
    for name in ("greedy", "beam", "int8"):
        builtin = LiteRTModel(exports / f"builtin-{name}")
        assert builtin.settings["ops"] == "builtin" and set(builtin.settings["tokenizers"]) == {"source", "target"}
        model = (exports / f"builtin-{name}" / litert.MODEL_FILE).read_bytes()
        litert.check_operators(model, allowed=())  # refuses any custom operator
        theirs, ours = builtin.run(SENTENCES), LiteRTModel(exports / name).run(SENTENCES)
        same = [a == b for a, b in zip(theirs["translation"], ours["translation"])]
        if name == "beam":
            assert sum(same) >= 0.99 * len(SENTENCES) - 1, list(zip(theirs["translation"], ours["translation"]))
            assert np.all(theirs["score"] >= ours["score"] - 1e-4)
        else:
            assert all(same), [pair for pair, equal in zip(zip(theirs["translation"], ours["translation"]), same)
                               if not equal]
        np.testing.assert_array_equal(theirs["truncated"], ours["truncated"])
    # A text file holds tensorflow-text's kernels: refused where only builtin operators may be.
    with pytest.raises(ValueError, match="stock LiteRT .builtin operators only. lacks: .*Wordpiece"):
        litert.check_operators((exports / "greedy" / litert.MODEL_FILE).read_bytes(), allowed=())


@pytest.mark.slow
def test_the_builtin_classifier_and_language_model_answer_as_their_text_files(classifier_exports,
                                                                              language_model_export):
    classifier, _ = classifier_exports
    builtin, text = LiteRTModel(classifier / "builtin"), LiteRTModel(classifier / "litert")
    np.testing.assert_allclose(builtin.run(CLASSIFIER_TEXTS)["probabilities"], text.run(CLASSIFIER_TEXTS)["probabilities"],
                               atol=1e-6)
    assert builtin.classify(CLASSIFIER_TEXTS) == text.classify(CLASSIFIER_TEXTS)
    _, language_model = language_model_export
    builtin, text = LiteRTModel(language_model.with_name("builtin")), LiteRTModel(language_model)
    for settings in (dict(temperature=0), dict(seed=4, top_k=5, temperature=0.8), dict(seed=5, max_new_tokens=6)):
        assert builtin.generate(PROMPTS, **settings) == text.generate(PROMPTS, **settings), settings
    with pytest.raises(ValueError, match="top_p must be in"):
        builtin.generate(PROMPTS, top_p=1.5)


@pytest.mark.slow
def test_malformed_requests_to_a_builtin_file_are_refused_in_one_line_and_it_serves_on(litert_exports):
    _, exports = litert_exports
    model = LiteRTModel(exports / "builtin-greedy")
    for bad, message in (("one string", "texts must be a list of strings"), (5, "texts must be a list of strings")):
        with pytest.raises(ValueError, match=message):
            model.translate(bad)
    with pytest.raises(ValueError, match="batch_size must be"):
        model.translate(["a"], batch_size=0)
    with pytest.raises(ValueError, match="takes no source_language"):
        model.translate(["a"], source_language="en", target_language="de")
    assert model.translate([]) == [] and model.run([])["translation"].shape == (0,)
    assert model.translate(["A dog.", " "]) == LiteRTModel(exports / "greedy").translate(["A dog.", " "])


def test_a_host_tokenizer_that_reads_otherwise_refuses_the_export_and_nothing_is_written(trained_demo_run, tmp_path,
                                                                                       monkeypatch):
    run, _ = trained_demo_run
    from keras_transformer.text import WordPieceTokenizer

    as_written = WordPieceTokenizer.hugging_face_json

    def without_cjk_split(tokenizer):  # the probe sentence "東京タワー" is then one unknown word, not three
        spec = as_written(tokenizer)
        spec["normalizer"]["normalizers"] = [{"type": "NFC"}]
        return spec

    monkeypatch.setattr(WordPieceTokenizer, "hugging_face_json", without_cjk_split)
    with pytest.raises(ValueError, match=r"^the source tokenizer's host library reads 1 of \d+ held-out sentences "
                                         r"otherwise than the run \(e.g. '東京タワー .*'\): export --ops text instead$"):
        translation.export_litert(str(run), str(tmp_path / "out"), ops="builtin")
    assert not (tmp_path / "out").exists() and os.listdir(tmp_path) == []


def test_ops_is_refused_in_one_line_where_it_means_nothing(trained_demo_run, tmp_path):
    run, _ = trained_demo_run
    result = cli_here("export", run, tmp_path / "out", "--ops", "builtin", check=False)
    assert result.returncode != 0 and result.stderr.strip().splitlines() == [
        "keras-transformer: error: --ops is for --format litert"], result.stderr
    assert not (tmp_path / "out").exists()
