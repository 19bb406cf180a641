"""CTranslate2 as a deployment target: the converted model scores and translates as ours does.

Tiny random models of each architecture option are converted and compared
with ours on log-probabilities and greedy translations, text in and text
out; the demo run goes through `export --format ctranslate2` and
`translate --ctranslate2` on the command line.
"""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.export.ctranslate2 import CTranslate2Translator, export_ctranslate2, model_spec
from keras_transformer.inference import DecodingSettings, Translator
from keras_transformer.models import Transformer
from keras_transformer.text import WordPieceTokenizer

ctranslate2 = pytest.importorskip("ctranslate2")
pytestmark = pytest.mark.tensorflow

WORDS = [f"w{index}" for index in range(56)]
# Each option we train, against CTranslate2's equivalent.
ARCHITECTURES = {
    "paper: post-LN, sinusoidal, ReLU, one shared vocabulary, tied output": dict(
        share_embeddings=True, tie_output=True
    ),
    "GPT-like: pre-LN, learned positions, GELU, two vocabularies, separate output": dict(
        norm_first=True, position="learned", activation="gelu"
    ),
}


def tiny_translator(source_words, target_words, seed=3, **architecture):
    keras.utils.set_random_seed(seed)
    source = WordPieceTokenizer(["[PAD]", "[UNK]", "[START]", "[END]", *source_words])
    target = WordPieceTokenizer(["[PAD]", "[UNK]", "[START]", "[END]", *target_words])
    model = Transformer(source.vocab_size, target.vocab_size, num_layers=2, d_model=32, num_heads=4, d_ff=64,
                        max_length=20, **architecture)
    model.build(((None, None), (None, None)))
    # A trained model never predicts [PAD], [UNK] or [START]; random output biases make sources matter.
    bias = np.random.default_rng(seed).normal(0, 1, target.vocab_size).astype("float32")
    bias[:3] = -20.0
    (model.output_bias if model.tie_output else model.output_projection.bias).assign(bias)
    return Translator(model, source, target, DecodingSettings(beam_size=1, max_extra_length=6))


def sentences(count, seed=1):
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, rng.integers(1, 9))) for _ in range(count)]
    return texts + ["", " ".join(WORDS[:30])]  # nothing to translate; longer than max_length: cut as ours


@pytest.mark.slow  # another runtime: a conversion and its model loaded per architecture
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_converted_model_scores_and_translates_text_as_ours(architecture, tmp_path):
    target_words = WORDS if ARCHITECTURES[architecture].get("share_embeddings") else [f"v{i}" for i in range(40)]
    translator = tiny_translator(WORDS, target_words, **ARCHITECTURES[architecture])
    out = export_ctranslate2(translator, str(tmp_path / "ct2"))
    converted = CTranslate2Translator(out)

    # Teacher-forced log-probabilities of [START] + target -> target + [END].
    texts = sentences(6)[:6]
    source_ids = translator.source_ids(tf.constant(texts)).numpy()
    targets = np.random.default_rng(2).integers(4, translator.model.tgt_vocab_size, (6, 7)).astype("int32")
    decoder_inputs = np.concatenate([np.full((6, 1), 2, "int32"), targets], axis=1)
    log_probs = tf.nn.log_softmax(translator.model((tf.constant(source_ids), tf.constant(decoder_inputs)))).numpy()
    labels = np.concatenate([targets, np.full((6, 1), 3)], axis=1)
    expected = np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    target_vocab = translator.target_tokenizer.vocab
    scored = converted.translator.score_batch(
        converted.source_tokens(texts), [[target_vocab[token] for token in row] for row in targets]
    )
    np.testing.assert_allclose(np.array([result.log_probs for result in scored]), expected, atol=1e-4)

    texts = sentences(30)
    ours = translator.translate(texts)
    assert converted.translate(texts, batch_size=8) == ours
    assert ours[-2] == "" and len(set(ours)) > 5  # an untrained model's outputs still depend on the source
    # Beam search runs once per output limit: a sentence's translation does not depend on its batch.
    beam = converted.translate(texts, beam_size=4, batch_size=8)
    assert len(beam) == len(texts) and beam[-2] == ""
    assert [converted.translate([text], beam_size=4)[0] for text in texts[:5]] == beam[:5]


def test_what_ctranslate2_cannot_run_and_a_taken_directory_are_refused(tmp_path):
    local = tiny_translator(WORDS, WORDS, sliding_window=4)
    with pytest.raises(ValueError, match="cannot run local attention \\(sliding_window\\)"):
        model_spec(local.model, local.source_tokenizer.vocab, local.target_tokenizer.vocab)
    translator = tiny_translator(WORDS, WORDS)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="already exists"):
        export_ctranslate2(translator, str(taken))
    assert (taken / "mine.txt").read_text() == "keep me"
    with pytest.raises(ValueError, match="quantization must be one of"):
        export_ctranslate2(translator, str(tmp_path / "new"), quantization="int4")
    with pytest.raises(FileNotFoundError, match="not a CTranslate2 export"):
        CTranslate2Translator(str(taken))
    # A damaged export: one ValueError naming the directory, not a traceback from CTranslate2.
    damaged = export_ctranslate2(translator, str(tmp_path / "damaged"))
    with open(f"{damaged}/model.bin", "r+b") as model_file:
        model_file.truncate(100)
    with pytest.raises(ValueError, match="is not a loadable CTranslate2 model"):
        CTranslate2Translator(damaged)
    (tmp_path / "damaged" / "keras_transformer.json").write_text("{}")
    with pytest.raises(ValueError, match="is damaged: it lacks beam_size"):
        CTranslate2Translator(damaged)


@pytest.fixture(scope="module")
def ctranslate2_export(trained_demo_run, tmp_path_factory):
    """The demo run exported by `export --format ctranslate2` in this process: `(directory, what it printed)`."""
    from helpers import cli_here

    run, _ = trained_demo_run
    out = tmp_path_factory.mktemp("ctranslate2") / "ct2"
    return out, cli_here("export", run, out, "--format", "ctranslate2").stdout


@pytest.mark.slow
def test_export_format_ctranslate2_and_translate_with_it_on_the_command_line(trained_demo_run, ctranslate2_export,
                                                                             tmp_path):
    from helpers import cli_here as cli  # the commands in this process; test_cli.py proves the console script
    from keras_transformer.data import demo_corpus

    run, _ = trained_demo_run
    sources = [source for source, _ in demo_corpus()["val"][:40]]
    out, exported = ctranslate2_export
    assert f"exported CTranslate2 model: {out}" in exported
    ours = cli("translate", run, "--beam-size", "1", input="\n".join(sources) + "\n").stdout.splitlines()
    theirs = cli("translate", "--ctranslate2", out, "--beam-size", "1", input="\n".join(sources) + "\n")
    assert theirs.stdout.splitlines() == ours

    # int8 weights: a translation per sentence (this briefly trained model's outputs are too fragile to
    # compare word for word; the BLEU cost of int8 is measured on trained runs, in BENCHMARKS.md).
    int8 = tmp_path / "ct2-int8"
    cli("export", run, int8, "--format", "ctranslate2", "--quantization", "int8")
    assert json.loads((int8 / "keras_transformer.json").read_text())["quantization"] == "int8"
    quantized = cli("translate", "--ctranslate2", int8, "--beam-size", "1", *sources).stdout.splitlines()
    assert len(quantized) == len(sources) and all(quantized)

    again = cli("export", run, out, "--format", "ctranslate2", check=False)
    assert again.returncode == 2 and "already exists" in again.stderr
    wrong = cli("export", run, tmp_path / "x", "--quantization", "int8", check=False)
    assert wrong.returncode == 2 and "--quantization is for --format ctranslate2" in wrong.stderr


@pytest.mark.slow
def test_a_document_comes_out_of_ctranslate2_with_as_many_lines_each_translated_as_if_alone(ctranslate2_export):
    from helpers import DOCUMENT, check_one_answer_per_line, cli_here

    out, _ = ctranslate2_export
    result = cli_here("translate", "--ctranslate2", out, "--beam-size", "2", input=DOCUMENT)
    translator = CTranslate2Translator(out)  # what the command runs, given each line alone
    check_one_answer_per_line(result, lambda text: translator.translate([text], beam_size=2)[0])
    pieces = json.loads((out / "keras_transformer.json").read_text())["max_source_length"] - 2
    assert f"line 5 is longer than the model reads: only its first {pieces} pieces were translated" in result.stderr
