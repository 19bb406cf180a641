"""A translation run trained here on a SentencePiece vocabulary: it trains, translates, evaluates and exports."""

import json
import zipfile

import keras
import numpy as np
import pytest
from helpers import cli_here

from keras_transformer.data import demo_corpus
from keras_transformer.runs import translation

SENTENCES = [source for source, _ in demo_corpus()["val"][:20]] + ["", "Tōkyō 東京 2024 🙂 café"]


@pytest.mark.slow
def test_a_sentencepiece_run_translates_alike_through_the_run_and_every_export(sentencepiece_run, tmp_path):
    """The session's SentencePiece run was trained in mixed bfloat16: every road reads it in float32, CTranslate2
    (float32 on a CPU) included (the next test checks the policies of the model loaded)."""
    run = sentencepiece_run
    config = translation.load_config(str(run))
    assert config["tokenizer"]["kind"] == "sentencepiece"
    # One model for both sides, saved per side: the source framed without <s>, as Marian frames it.
    assert (run / "vocab" / "source" / "sentencepiece.model").read_bytes() == (
        run / "vocab" / "target" / "sentencepiece.model").read_bytes()
    greedy = translation.translate(str(run), SENTENCES, beam_size=1)
    assert len(set(greedy)) > 10  # a model that tells sentences apart

    exports = {"saved_model": tmp_path / "saved_model", "ctranslate2": tmp_path / "ct2", "litert": tmp_path / "lite"}
    translation.export(str(run), str(exports["saved_model"]), beam_size=1)
    # CTranslate2's through the command, at the run's own beam size (translated below with --beam-size 1).
    cli_here("export", run, exports["ctranslate2"], "--format", "ctranslate2")
    translation.export_litert(str(run), str(exports["litert"]), beam_size=1)
    for road, path in exports.items():
        # The user's command on each export, in this process (a SentencePiece SavedModel in a fresh process
        # that imports only TensorFlow and tensorflow-text: test_pretrained.py, on an imported Marian run).
        options = ["--beam-size", 1] if road == "ctranslate2" else []
        printed = cli_here("translate", f"--{road.replace('_', '-')}", path, *options, *SENTENCES).stdout.split("\n")[:-1]
        assert printed == greedy, road

    evaluated = cli_here("evaluate", run, "--beam-size", 1).stdout
    assert "BLEU" in evaluated


def test_the_run_trained_in_mixed_bfloat16_is_read_computing_in_float32(sentencepiece_run):
    """Every inference road computes in float32 by default, whatever the run trained in (docs/serving.md)."""
    run = sentencepiece_run
    # The run trained, and saved its model, in mixed bfloat16 ...
    assert json.loads((run / "config.json").read_text())["training"]["precision_chosen"] == "mixed_bfloat16"
    with zipfile.ZipFile(run / "model.keras") as archive:
        assert json.loads(archive.read("config.json"))["config"]["dtype"]["config"]["name"] == "mixed_bfloat16"
    # ... and is loaded computing in float32, even where the process's policy is still the training's.
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = translation.load_translator(run).model
    assert {layer.compute_dtype for layer in model._flatten_layers()} == {"float32"}
    as_trained = translation.load_translator(run, precision=None).model  # asked for: the policy it was saved with
    assert as_trained.compute_dtype == "bfloat16" and as_trained.variable_dtype == "float32"
    for ours, saved in zip(model.weights, as_trained.weights):
        np.testing.assert_array_equal(ours.numpy(), saved.numpy())
    # Computed in bfloat16, a run's greedy translations are not all CTranslate2's (a WordPiece demo run's on
    # an AMD EPYC with AVX-512 BF16: 1 of the first 10 and 6 of the first 100 differed); in float32 they
    # are (the test above, through `export --format ctranslate2`).


@pytest.mark.parametrize("options, message", [
    (["--tokenizer", "sentencepiece", "--sentencepiece-model", "wordpiece"], "invalid choice"),
    (["--tokenizer", "sentencepiece", "--character-coverage", 0.5], "character_coverage must be between 0.98 and 1.0"),
    (["--sentencepiece-model", "bpe"], "--sentencepiece-model: for --tokenizer sentencepiece"),
])
def test_a_sentencepiece_option_that_cannot_be_used_is_refused_in_one_line_before_anything_is_written(
        options, message, tmp_path):
    refused = cli_here("train", "--dataset", "demo", "--out", tmp_path / "run", *options, check=False)
    assert refused.returncode == 2
    assert message in refused.stderr.strip().splitlines()[-1]  # said in the last line, not a traceback
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "run").exists()


def test_a_vocabulary_smaller_than_the_alphabet_is_refused_in_one_line():
    from keras_transformer.text import SentencePieceTokenizer

    with pytest.raises(ValueError, match="Vocabulary size is smaller than required_chars") as refused:
        SentencePieceTokenizer.learn(SENTENCES * 10, vocab_size=8)
    assert "\n" not in str(refused.value)


def test_a_sentencepiece_run_made_with_one_shared_folder_keeps_its_start_token_on_the_source(
        sentencepiece_run, tmp_path):
    """Runs made before sources were framed as Marian's kept one `vocab/shared` (<s> on both sides): still so."""
    config = translation.load_config(str(sentencepiece_run))
    _, target = translation.tokenizers(str(sentencepiece_run), config["tokenizer"])
    older = tmp_path / "older"
    target.save(str(older / "vocab" / "shared"))
    source, loaded_target = translation.tokenizers(str(older), config["tokenizer"])
    assert source is loaded_target and source.start_id == target.start_id
    assert source.tokenize(["A dog."]).to_list()[0][0] == target.start_id
    fresh_source, _ = translation.tokenizers(str(sentencepiece_run), config["tokenizer"])
    assert fresh_source.tokenize(["A dog."]).to_list()[0] == source.tokenize(["A dog."]).to_list()[0][1:]
