"""`export --format hf`: runs go out as Hugging Face checkpoints that Transformers, CTranslate2 and we read back.

`make test` has no PyTorch: what Transformers and CTranslate2's converter did
with these very exports was recorded by `fixtures/published/record.py`, and
each test that reads the recording first checks that today's export still
writes the recorded files, byte for byte. The imported fixtures
(`fixtures/pretrained`) go back to their own family, tensor for tensor.
"""

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import DATA, cli_here, read_sentences
from safetensors import safe_open

from keras_transformer.data import demo_corpus
from keras_transformer.runs import run_dir as runs
from keras_transformer.runs import translation
from keras_transformer.runs.options import DEFAULTS, TRANSLATION, merge_config
from keras_transformer.saving import save_model, write_json
from keras_transformer.text import SentencePieceTokenizer

FIXTURES = Path(__file__).parent / "fixtures"
PUBLISHED, PRETRAINED = FIXTURES / "published", FIXTURES / "pretrained"
CHECKPOINTS = ("marian-shared-swish", "marian-separate-relu", "m2m100-en-de", "nllb-en-de")
RECORDED = json.loads((PUBLISHED / "expected.json").read_text(encoding="utf-8"))["exports"]


def digests(directory):
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(Path(directory).iterdir())}


def tensors(directory):
    """`{name: (dtype, raw bytes)}` of a checkpoint's model.safetensors."""
    with safe_open(str(Path(directory) / "model.safetensors"), framework="np") as file:
        return {name: (file.get_slice(name).get_dtype(), file.get_tensor(name).tobytes()) for name in file.keys()}


def padded(rows):
    width = max(len(row) for row in rows)
    return np.array([row + [0] * (width - len(row)) for row in rows], np.int32)


# -- a run trained here, as Marian --------------------------------------------------------------


@pytest.fixture(scope="module")
def exported_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("published") / "run"
    printed = cli_here("export", PUBLISHED / "run", out, "--format", "hf").stdout
    assert "exported Hugging Face checkpoint" in printed
    return out


def test_the_export_writes_the_files_transformers_was_recorded_reading(exported_run):
    assert digests(exported_run) == RECORDED["run"]["files"]
    config = json.loads((exported_run / "config.json").read_text())
    assert config["model_type"] == "marian" and config["share_encoder_decoder_embeddings"]


def test_transformers_reads_the_export_as_the_run_computes_it(exported_run):
    """The same source ids, logits within 1e-4 on a padded batch, greedy identical, beam 4 nearly so."""
    want = RECORDED["run"]
    hugging_face = np.load(PUBLISHED / "expected.npz")
    translator = translation.load_translator(str(PUBLISHED / "run"), beam_size=1)
    source_ids = translator.source_tokenizer.tokenize(want["sources"]).to_list()
    # Their ids are ours less one; our padding id 0 is their last, <pad>.
    assert [[token - 1 for token in row] for row in source_ids] == want["source_ids"]

    rows = len(hugging_face["source_ids"])
    decoder_inputs = np.where(hugging_face["real"], hugging_face["decoder_input_ids"] + 1, 0)
    logits = translator.model((padded(source_ids[:rows]), decoder_inputs), training=False).numpy()
    theirs = np.roll(logits, -1, axis=-1)[hugging_face["real"]]
    np.testing.assert_allclose(theirs[:, :-1], hugging_face["logits"][:, :-1], atol=1e-4)

    assert translator.translate(want["sources"]) == want["greedy"]
    beam = translation.translate(str(PUBLISHED / "run"), want["sources"], beam_size=4)
    # Hugging Face divides a beam's score by length ** 0.6, we by GNMT's ((5 + length) / 6) ** 0.6.
    assert sum(ours == theirs for ours, theirs in zip(beam, want["beam4"])) >= 0.97 * len(beam)


def test_the_export_imported_back_decodes_as_transformers_did(exported_run, tmp_path):
    """Imported, the export decodes with Hugging Face's rules (its generation_config.json): beam 4 identical."""
    want = RECORDED["run"]
    translation.import_checkpoint(str(exported_run), str(tmp_path / "back"))
    assert translation.translate(str(tmp_path / "back"), want["sources"]) == want["beam4"]
    assert translation.translate(str(tmp_path / "back"), want["sources"], beam_size=1) == want["greedy"]


# -- imported checkpoints, back to their family --------------------------------------------------


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_an_imported_checkpoint_goes_back_tensor_for_tensor_and_translates_the_same(name, tmp_path):
    run_dir, out, back = tmp_path / "run", tmp_path / "exported", tmp_path / "back"
    translation.import_checkpoint(str(PRETRAINED / name), str(run_dir))
    translation.export_hf(str(run_dir), str(out))
    original = tensors(PRETRAINED / name)
    assert tensors(out) == original  # names, dtypes (float16 stays float16) and bits
    recordings = {"expected.json", "expected.npz", "tokens.json", "pytorch_model.bin"}  # the fixture's, not HF's
    assert set(os.listdir(out)) == set(os.listdir(PRETRAINED / name)) - recordings
    for file in os.listdir(out):  # the settings and tokenizer files as the checkpoint came with them
        if file != "model.safetensors":
            assert (out / file).read_bytes() == (PRETRAINED / name / file).read_bytes(), file
    translation.import_checkpoint(str(out), str(back))
    sentences = ["The dog runs.", "Two men sit on a bench in the park."]
    assert translation.translate(str(back), sentences) == translation.translate(str(run_dir), sentences)


def fine_tuned(name, tmp_path):
    """The checkpoint `name` imported, then fine-tuned by `train --init-from` for 4 steps: the fine-tuned run."""
    imported, tuned = tmp_path / "imported", tmp_path / "tuned"
    translation.import_checkpoint(str(PRETRAINED / name), str(imported))
    english, german = ((DATA / "multi30k" / name).read_text(encoding="utf-8").splitlines()[3000:3064]
                       for name in ("train.en", "train.de"))
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{source}\t{target}\n" for source, target in zip(english, german)), encoding="utf-8")
    cli_here("train", "--init-from", imported, "--dataset", "files", "--train-tsv", pairs, "--epochs", 1,
             "--steps-per-epoch", 4, "--batch-size", 16, "--warmup-steps", 2, "--attention-samples", 0,
             "--bleu-samples", 0, "--no-evaluate", "--out", tuned)
    return tuned


@pytest.mark.parametrize("name", ["marian-shared-swish", "nllb-en-de"])
def test_a_fine_tuned_run_goes_out_with_its_new_weights(name, tmp_path, request):
    """Marian's output bias trains; NLLB's checkpoint has none, so ours stays as imported and the run goes back."""
    # Marian: the session's fine-tuned run, which test_pretrained's fine-tuning test reads too (conftest.py).
    tuned = request.getfixturevalue("fine_tuned_marian")[1] if name == "marian-shared-swish" else fine_tuned(
        name, tmp_path)
    out = tmp_path / "exported"
    assert (tuned / "pretrained" / "config.json").is_file()  # the checkpoint's files came along

    printed = cli_here("export", tuned, out, "--format", "hf").stdout
    assert "exported Hugging Face checkpoint" in printed
    exported, original = tensors(out), tensors(PRETRAINED / name)
    assert exported.keys() == original.keys()
    assert exported["model.shared.weight"] != original["model.shared.weight"]  # trained
    translation.import_checkpoint(str(out), str(tmp_path / "back"))
    config = translation.load_config(str(tuned))
    source, target = translation.tokenizers(str(tuned), config["tokenizer"])
    build = lambda: translation.build_model(config, source.vocab_size, target.vocab_size)  # noqa: E731
    for ours, back in zip(runs.load_trained_model(str(tuned), build).weights,
                          runs.load_trained_model(str(tmp_path / "back"), build).weights):
        ours_value, back_value = ours.numpy(), back.numpy()
        if ours_value.shape[0] == target.vocab_size:  # our padding id's row is ours alone: no checkpoint has it
            ours_value, back_value = ours_value[1:], back_value[1:]
        np.testing.assert_array_equal(ours_value, back_value, err_msg=ours.path)


# -- CTranslate2's own converter -------------------------------------------------------------------


def test_our_ctranslate2_export_translates_as_ctranslate2s_converter_did_on_the_export(tmp_path):
    """Recorded: `ct2-transformers-converter` on the NLLB fixture's round trip; ours converts the run itself."""
    pytest.importorskip("ctranslate2")
    want = RECORDED["nllb-en-de"]
    run_dir = tmp_path / "run"
    translation.import_checkpoint(str(PRETRAINED / "nllb-en-de"), str(run_dir))
    translation.export_hf(str(run_dir), str(tmp_path / "exported"))
    assert digests(tmp_path / "exported") == want["files"]
    translation.export_ctranslate2(str(run_dir), str(tmp_path / "ct2"))
    sources = read_sentences(want["sources"])
    for name, beam_size in (("greedy", 1), ("beam4", 4)):
        ours = translation.translate_with_ctranslate2(str(tmp_path / "ct2"), sources, beam_size=beam_size)
        assert ours == want["ctranslate2"][name], name


# -- what Marian expresses, and what it does not -----------------------------------------------


def untrained_run(run_dir, source, target, **model):
    """A run directory with these tokenizers and a model of these settings, its weights as initialised."""
    config = merge_config(DEFAULTS[TRANSLATION], {
        "tokenizer": {"kind": "sentencepiece", "shared": False},
        "model": {"preset": None, "num_layers": 1, "d_model": 16, "num_heads": 2, "d_ff": 32, **model},
        "training": {"max_length": 64},
    })
    source.save(runs.vocab_path(str(run_dir), "source"))
    target.save(runs.vocab_path(str(run_dir), "target"))
    write_json(runs.path(str(run_dir), runs.CONFIG), config)
    built = translation.build_model(config, source.vocab_size, target.vocab_size)
    save_model(built, runs.path(str(run_dir), runs.MODEL))
    return run_dir


def learned_pair(source_size, target_size):
    corpus = demo_corpus()["train"][:2000]
    source = SentencePieceTokenizer.learn([s for s, _ in corpus], vocab_size=source_size, start_token=None)
    target = SentencePieceTokenizer.learn([t for _, t in corpus], vocab_size=target_size, model_type="bpe")
    return source, target


@pytest.fixture(scope="module")
def sentencepiece_pair():
    """Separate source and target SentencePiece vocabularies, the target's the larger."""
    return learned_pair(120, 200)


@pytest.mark.parametrize("position, sizes", [("sinusoidal", (120, 200)), ({"columns": "blocked"}, (200, 120))])
def test_separate_vocabularies_and_an_untied_output_go_out_and_come_back_the_same(position, sizes, tmp_path):
    """Marian's one padding id, last on both sides (unused tokens on the smaller), lm_head, both sinusoid layouts."""
    source, target = learned_pair(*sizes)
    run_dir = untrained_run(tmp_path / "run", source, target, position=position, activation="gelu")
    translation.export_hf(str(run_dir), str(tmp_path / "exported"))
    config = json.loads((tmp_path / "exported" / "config.json").read_text())
    larger = max(source.vocab_size, target.vocab_size)
    assert config["vocab_size"] == config["decoder_vocab_size"] == larger and config["pad_token_id"] == larger - 1
    for vocab_file in ("vocab.json", "target_vocab.json"):  # <pad> is the one padding id on both sides
        vocab = json.loads((tmp_path / "exported" / vocab_file).read_text())
        assert len(vocab) == larger and vocab["<pad>"] == config["pad_token_id"], vocab_file
    generation = json.loads((tmp_path / "exported" / "generation_config.json").read_text())
    assert generation["bad_words_ids"] == [[index] for index in range(target.vocab_size - 1, larger)]
    assert not config["share_encoder_decoder_embeddings"] and not config["tie_word_embeddings"]
    assert "lm_head.weight" in tensors(tmp_path / "exported")
    translation.import_checkpoint(str(tmp_path / "exported"), str(tmp_path / "back"))

    texts = [text for text, _ in demo_corpus()["val"][:4]]
    ours, back = (translation.load_translator(str(path), beam_size=1) for path in (run_dir, tmp_path / "back"))
    source_ids = padded(ours.source_tokenizer.tokenize(texts).to_list())
    assert (back.source_tokenizer.tokenize(texts).to_list() == ours.source_tokenizer.tokenize(texts).to_list())
    decoder_ids = padded([[target.start_id] + row[1:-1] for row in target.tokenize(
        [target_text for _, target_text in demo_corpus()["val"][:4]]).to_list()])
    logits = ours.model((source_ids, decoder_ids), training=False).numpy()
    imported = back.model((source_ids, decoder_ids), training=False).numpy()
    real, pieces = decoder_ids != 0, target.vocab_size - 1
    # The pieces' logits (ids 1..pieces in both: the import puts our padding id in front of their vocabulary);
    # LayerNorm's epsilon is 1e-6 here, 1e-5 in any Marian checkpoint (publish's docstring).
    np.testing.assert_allclose(logits[..., 1:][real], imported[..., 1 : 1 + pieces][real], atol=1e-4)
    assert (imported[..., 1 + pieces : -1][real] < -25).all()  # unused tokens': never chosen


def test_what_marian_cannot_express_is_refused_in_one_line_before_anything_is_written(
        sentencepiece_pair, trained_demo_run, tmp_path):
    source, target = sentencepiece_pair
    cases = {
        "pre-LN layers": untrained_run(tmp_path / "pre-ln", source, target, norm_first=True),
        "learned positions": untrained_run(tmp_path / "learned", source, target, position="learned"),
        "local cross-attention": untrained_run(tmp_path / "local", source, target, cross_attention_window=3),
        "puts <s> before its sources": untrained_run(tmp_path / "old", source.with_start_token("<s>"), target),
        "WordPiece": trained_demo_run[0],
    }
    for message, run_dir in cases.items():
        out = tmp_path / f"out-{len(message)}"
        refused = cli_here("export", run_dir, out, "--format", "hf", check=False)
        assert refused.returncode != 0 and "Traceback" not in refused.stderr, message
        assert message in refused.stderr.strip().splitlines()[-1], refused.stderr
        assert not out.exists() and not [name for name in os.listdir(tmp_path) if "incomplete" in name]

    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("the user's")
    for arguments, message in ((["--quantization", "int8"], "float32, float16 or bfloat16"),
                               (["--beam-size", "2"], "own decoding settings"),
                               ([], "already exists")):
        refused = cli_here("export", cases["pre-LN layers"] if message != "already exists" else
                           tmp_path / "learned", taken, "--format", "hf", *arguments, check=False)
        assert message in refused.stderr.strip().splitlines()[-1], refused.stderr
        assert os.listdir(taken) == ["mine.txt"]


def test_an_imported_run_without_its_checkpoint_files_is_refused_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(PRETRAINED / "marian-separate-relu", tmp_path / "checkpoint")
    translation.import_checkpoint(str(tmp_path / "checkpoint"), str(run_dir))
    shutil.rmtree(run_dir / "pretrained")  # as runs imported before export --format hf kept nothing
    translation.export_hf(str(run_dir), str(tmp_path / "from-checkpoint"))  # the checkpoint is still there
    assert tensors(tmp_path / "from-checkpoint") == tensors(PRETRAINED / "marian-separate-relu")
    shutil.rmtree(tmp_path / "checkpoint")
    with pytest.raises(FileNotFoundError, match="import the checkpoint again") as refused:
        translation.export_hf(str(run_dir), str(tmp_path / "out"))
    assert "\n" not in str(refused.value) and not (tmp_path / "out").exists()
