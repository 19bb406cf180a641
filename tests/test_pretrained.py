"""Pretrained Hugging Face checkpoints: imported, they translate exactly as Hugging Face does.

The checkpoints are tiny Marian models built with transformers and PyTorch
by `fixtures/pretrained/make_fixtures.py`, which also recorded what Hugging
Face does with them (`expected.json`, `expected.npz`): these tests need
neither. The tokenizer is checked on a real OPUS-MT checkpoint's files
(`../shared/data/opus-mt-en-mg`, no weights) against `MarianTokenizer`'s ids.
When transformers and PyTorch are installed, one test also runs HF live.
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from helpers import DATA, assert_it_lived, cli_here, read_sentences, run
from keras_transformer import pretrained
from keras_transformer.inference import Translator, score_sequences
from keras_transformer.pretrained import CheckpointError, marian
from keras_transformer.runs import translation

FIXTURES = Path(__file__).parent / "fixtures" / "pretrained"
CHECKPOINTS = ("marian-shared-swish", "marian-separate-relu", "m2m100-en-de", "nllb-en-de")


def expected(name):
    """What Hugging Face did with a fixture checkpoint: `(expected.json with its sentences read, expected.npz)`.

    transformers 5.24 leaves M2M100's target-language token in decoded text
    ("__de__ Ein Hund."); we drop it, as transformers 4 did: the recorded
    texts are compared without it.
    """
    recorded = json.loads((FIXTURES / name / "expected.json").read_text())
    recorded["sources"] = read_sentences(recorded["sources"])
    recorded["logit_targets"] = read_sentences(recorded["logit_targets"])
    for search in ("greedy", "beam4"):
        recorded[search]["text"] = [text.removeprefix("__de__ ").removeprefix("__de__") for text in recorded[search]["text"]]
    return recorded, np.load(FIXTURES / name / "expected.npz")


def ours(ids):
    """Our ids of a row of the checkpoint's (ours are theirs + 1; 0 is our padding)."""
    return [int(i) + 1 for i in ids]


def theirs(row):
    return [int(i) - 1 for i in row if i != 0]


@pytest.fixture(scope="module", params=CHECKPOINTS)
def imported(request):
    return request.param, pretrained.load(str(FIXTURES / request.param))


# -- the tokenizer, on a real OPUS-MT checkpoint's files ---------------------------------------


@pytest.mark.skipif(not (DATA / "opus-mt-en-mg").exists(), reason="needs ../shared/data/opus-mt-en-mg")
def test_token_ids_equal_marian_tokenizers_on_a_real_checkpoint():
    """Accents, digits, punctuation, CJK, emoji, empty, over-long, >>xx<< codes: the same ids, the same text back."""
    folder = DATA / "opus-mt-en-mg"
    recorded = json.loads((FIXTURES / "opus-mt-en-mg-tokens.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    source, target = marian.tokenizers(str(folder), config)
    sentences = read_sentences(recorded["sentences"])
    assert len(sentences) > 250
    ids = source.tokenize(tf.constant(sentences)).to_list()
    wrong = [(text, theirs(row), want) for text, row, want in zip(sentences, ids, recorded["ids"]) if theirs(row) != want]
    assert not wrong, wrong[:3]
    # The target side frames with the decoder's start token first.
    target_ids = target.tokenize(tf.constant(sentences[: len(recorded["target_ids"])])).to_list()
    assert all(row[0] == target.start_id for row in target_ids)
    assert [theirs(row[1:]) for row in target_ids] == recorded["target_ids"]
    # Decoding: the ids of each sentence back to text, and random ids too, as MarianTokenizer.decode does.
    decoded = [text.decode() for text in target.detokenize(tf.ragged.constant([ours(row) for row in recorded["ids"]])).numpy()]
    different = recorded["decoded_where_different"]
    assert decoded == [different.get(str(index), sentence) for index, sentence in enumerate(sentences)]
    random_decoded = target.detokenize(tf.ragged.constant([ours(row) for row in recorded["random_ids"]])).numpy()
    assert [text.decode() for text in random_decoded] == recorded["random_decoded"]


def test_nllb_token_ids_equal_nllb_tokenizers_spaces_unicode_and_unknowns_included():
    """NLLB's tokenizer is a `tokenizers` pipeline around the BPE; ours splits at spaces as its Metaspace does."""
    recorded = json.loads((FIXTURES / "nllb-en-de" / "tokens.json").read_text())
    config = json.loads((FIXTURES / "nllb-en-de" / "config.json").read_text())
    source, target = pretrained.m2m100.tokenizers(str(FIXTURES / "nllb-en-de"), config)
    assert [theirs(row) for row in source.tokenize(tf.constant(recorded["sentences"])).to_list()] == recorded["ids"]
    decoded = target.detokenize(tf.ragged.constant([ours(row) for row in recorded["ids"]])).numpy()
    assert [text.decode() for text in decoded] == recorded["decoded"]


# -- the model, against Hugging Face's recorded outputs ---------------------------------------------


def test_logits_equal_hugging_faces_on_a_padded_batch(imported):
    name, (model, source_tokenizer, target_tokenizer, _) = imported
    want, arrays = expected(name)
    source_ids = np.where(arrays["attention_mask"] == 1, arrays["source_ids"] + 1, 0)
    logits = model((source_ids, arrays["decoder_input_ids"] + 1), training=False).numpy()
    real = arrays["real"]
    np.testing.assert_allclose(logits[..., 1:][real], arrays["logits"], atol=1e-4)
    # The tokenizers made the same ids as Hugging Face's.
    assert [theirs(row) for row in source_tokenizer.tokenize(tf.constant(want["sources"])).to_list()] == want["source_ids"]
    targets = target_tokenizer.tokenize(tf.constant(want["logit_targets"])).to_list()
    assert [theirs(row[1:]) for row in targets] == want["target_ids"]


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_every_tensor_of_the_checkpoint_lands_in_the_model(name):
    """No weight of theirs is left unread (a layer mapped from the wrong name would leave one)."""
    from keras_transformer import models
    from keras_transformer.pretrained.checkpoint import read_config, read_weights
    from keras_transformer.pretrained.weights import WeightReader

    config = read_config(str(FIXTURES / name))
    family = pretrained.family_of(config)
    model = models.Transformer(**family.transformer_settings(config))
    model.build(((None, None), (None, None)))
    read = WeightReader(read_weights(str(FIXTURES / name)))
    family.assign_weights(model, read, config)
    assert read.unused() == [] and len(read.used) > 20


def test_an_embedding_table_goes_in_block_by_block_row_for_row(monkeypatch, tmp_path):
    """Tables longer than a block (OPUS-MT's 58k rows) land row for row, our padding row 0 zeros.

    Both ways a checkpoint is read: safetensors (fp16 here), read block by block
    from the file, and the arrays of a `pytorch_model.bin`.
    """
    import keras
    from safetensors.numpy import save_file

    from keras_transformer.pretrained import checkpoint, weights

    monkeypatch.setattr(weights, "ROWS_AT_ONCE", 4)
    theirs_table = np.random.default_rng(0).normal(size=(10, 3)).astype(np.float16)
    save_file({"model.shared.weight": theirs_table, "short": theirs_table[:9]}, str(tmp_path / "model.safetensors"))
    from_file = checkpoint.LazyWeights([str(tmp_path / "model.safetensors")])
    from_arrays = {"model.shared.weight": theirs_table.astype(np.float32), "short": theirs_table[:9]}
    for tensors in (from_file, from_arrays):
        table = keras.Variable(np.ones((11, 3), np.float32))
        weights.assign_embeddings(table, weights.WeightReader(tensors), "model.shared.weight")
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(table),
                                      np.concatenate([np.zeros((1, 3)), theirs_table.astype(np.float32)]))
        with pytest.raises(ValueError, match="does not fit"):
            weights.assign_embeddings(table, weights.WeightReader(tensors), "short")


def _translate(name, **overrides):
    translator = pretrained.load_translator(str(FIXTURES / name), **overrides)
    want, _ = expected(name)
    outputs = translator(tf.constant(want["sources"]))
    return translator, want, [theirs(row) for row in outputs["tokens"].numpy()], outputs


def test_greedy_output_is_hugging_faces_token_for_token(imported):
    name, _ = imported
    _, want, tokens, outputs = _translate(name, beam_size=1)
    texts = [text.decode() for text in outputs["translation"].numpy()]
    # The last source is "": we translate it to "" (Hugging Face makes something of </s> alone).
    assert want["sources"][-1] == "" and tokens[-1] == [] and texts[-1] == ""
    assert tokens[:-1] == want["greedy"]["ids"][:-1]
    assert texts[:-1] == want["greedy"]["text"][:-1]


def test_beam_search_matches_hugging_face_or_finds_a_better_scoring_translation(imported):
    """Beam search stops as HF's does (its heuristic, no greedy path beside the beams): the same words, or a better score."""
    name, (model, _, target_tokenizer, _) = imported
    translator, want, tokens, outputs = _translate(name)
    assert translator.settings.beam_size == 4  # generation_config.json's num_beams
    same = [ours_ == hf for ours_, hf in zip(tokens[:-1], want["beam4"]["ids"][:-1])]
    assert sum(same) >= 0.97 * len(same), f"{sum(same)} of {len(same)} the same"
    hf_scores = np.array(want["beam4"]["scores"])
    ours_scores = outputs["score"].numpy()
    # Where both found the same, both scored it the same (HF's sum of log-probabilities / length).
    np.testing.assert_allclose(ours_scores[:-1][same], hf_scores[:-1][same], atol=1e-4)
    # Where they differ, HF's hypothesis scored by our model (teacher-forced) is no better than ours.
    source_ids = translator.source_ids(tf.constant(want["sources"]))
    hf_tokens = tf.ragged.constant([ours(row) for row in want["beam4"]["ids"]]).to_tensor()
    rescored = score_sequences(model, source_ids, hf_tokens, target_tokenizer.start_id,
                               translator.settings.length_penalty).numpy()
    limit = translator.settings.max_output_length  # there HF forces </s>, which teacher forcing does not
    forced_first = translator.settings.token_rules.forced_first is not None  # the same: a forced language token
    for index, is_same in enumerate(same):
        if not is_same:
            assert ours_scores[index] >= hf_scores[index] - 1e-5, (index, ours_scores[index], hf_scores[index])
            if len(want["beam4"]["ids"][index]) < limit and not forced_first:
                assert abs(rescored[index] - hf_scores[index]) < 1e-4, (index, rescored[index], hf_scores[index])


def test_a_float16_pytorch_bin_imports_the_same_weights(tmp_path):
    """The float16 `pytorch_model.bin` beside the safetensors holds the same numbers: read with PyTorch, or refused."""
    checkpoint = tmp_path / "bin-only"
    shutil.copytree(FIXTURES / "marian-shared-swish", checkpoint)
    (checkpoint / "model.safetensors").unlink()
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(CheckpointError, match="install PyTorch to read it"):
            pretrained.load(str(checkpoint))
        return
    from_bin = pretrained.load(str(checkpoint)).model
    from_safetensors = pretrained.load(str(FIXTURES / "marian-shared-swish")).model
    for ours_weight, theirs_weight in zip(from_bin.weights, from_safetensors.weights):
        np.testing.assert_array_equal(ours_weight.numpy(), theirs_weight.numpy())


def test_a_bfloat16_safetensors_checkpoint_imports_its_numbers_widened(tmp_path):
    """NumPy has no bfloat16: such tensors are read from the file's bytes (written here as safetensors lays them out)."""
    from safetensors.numpy import load_file

    checkpoint = tmp_path / "bf16"
    shutil.copytree(FIXTURES / "marian-shared-swish", checkpoint, ignore=shutil.ignore_patterns("*.bin"))
    weights = load_file(checkpoint / "model.safetensors")
    # A bfloat16 is a float32's top 16 bits.
    top_halves = {name: (value.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16) for name, value in weights.items()}
    header, offset = {}, 0
    for name, value in top_halves.items():
        header[name] = {"dtype": "BF16", "shape": list(value.shape), "data_offsets": [offset, offset + value.nbytes]}
        offset += value.nbytes
    header_bytes = json.dumps(header).encode()
    with open(checkpoint / "model.safetensors", "wb") as file:
        file.write(len(header_bytes).to_bytes(8, "little") + header_bytes)
        for value in top_halves.values():
            file.write(value.tobytes())
    model = pretrained.load(str(checkpoint)).model
    shared = (top_halves["model.shared.weight"].astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(model.encoder.embedding.embeddings.numpy()[1:], shared)
    query = (top_halves["model.encoder.layers.0.self_attn.q_proj.weight"].astype(np.uint32) << 16).view(np.float32)
    attention = model.encoder.encoder_layers[0].self_attention.attention
    np.testing.assert_array_equal(attention.query_kernel.numpy().reshape(query.shape[1], -1), query.T)


# -- the CLI: import-hf, a run directory like a trained one ---------------------------------------


@pytest.fixture(scope="module")
def imported_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("imported") / "opus-mt"
    result = cli_here("import-hf", FIXTURES / "marian-shared-swish", run_dir)
    assert "imported" in result.stdout
    return run_dir


# Not among the fixture's sentences: what the export must also answer exactly as the run does.
NON_ASCII = "Zwölf Ölfässer, 3,5 € — “gut”?"


@pytest.fixture(scope="module")
def beam_translations(imported_run):
    """`{sentence: translation}` of the imported run's CLI at the checkpoint's beam 4, in one call: the fixture's
    sentences but "", and NON_ASCII (the export's test compares with these)."""
    want, _ = expected("marian-shared-swish")
    sentences = want["sources"][:-1] + [NON_ASCII]
    lines = cli_here("translate", imported_run, *sentences).stdout.splitlines()
    assert len(lines) == len(sentences), lines
    return dict(zip(sentences, lines))


@pytest.mark.slow
def test_an_imported_run_translates_as_hugging_face_from_the_cli(imported_run, beam_translations):
    want, _ = expected("marian-shared-swish")
    result = cli_here("translate", imported_run, "--beam-size", "1", *want["sources"][:4])
    assert result.stdout.splitlines() == want["greedy"]["text"][:4]
    # The checkpoint's beam 4, searched as Hugging Face searches (the run records it): every sentence but "".
    assert [beam_translations[source] for source in want["sources"][:-1]] == want["beam4"]["text"][:-1]
    # BLEU on the user's own pairs (an imported run has no corpus of its own).
    pairs = imported_run.parent / "pairs.tsv"
    pairs.write_text("".join(f"{source}\t{text}\n" for source, text in zip(want["sources"][:4], want["beam4"]["text"][:4])))
    result = cli_here("evaluate", imported_run, "--tsv", pairs)
    assert json.loads(result.stdout.strip().splitlines()[-1])["bleu"] == 100.0
    assert "give --tsv FILE" in cli_here("evaluate", imported_run, check=False).stderr
    # Attention maps label their rows and columns with the checkpoint's pieces.
    result = cli_here("plot-attention", imported_run, want["sources"][0], "--html", imported_run.parent / "a.html")
    assert "▁" in (imported_run.parent / "a.html").read_text(encoding="utf-8")


def test_refusals_come_in_one_line_and_write_nothing(imported_run, tmp_path):
    def refused(checkpoint, expected_message, *extra):
        out = tmp_path / f"run-{len(list(tmp_path.iterdir()))}"
        result = cli_here("import-hf", checkpoint, out, *extra, check=False)
        assert result.returncode == 2, result.stderr
        assert expected_message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert not out.exists() and not [path for path in tmp_path.iterdir() if "incomplete" in path.name]

    def edited(file_name, removed=(), **changes):
        checkpoint = tmp_path / f"checkpoint-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(FIXTURES / "marian-shared-swish", checkpoint)
        content = json.loads((checkpoint / file_name).read_text())
        content.update(changes)
        for key in removed:
            del content[key]
        (checkpoint / file_name).write_text(json.dumps(content))
        return checkpoint

    result = cli_here("import-hf", FIXTURES / "marian-shared-swish", imported_run, check=False)
    assert result.returncode == 2 and "already exists" in result.stderr
    refused(tmp_path / "nowhere", "no checkpoint directory")
    refused(edited("config.json", decoder_layers=3), "encoder_layers=2 differs from decoder_layers=3")
    refused(edited("config.json", removed=["d_model"]), "config.json has no 'd_model'")
    refused(edited("config.json", activation_function="gelu_new"), "activation_function='gelu_new' is not supported")
    refused(edited("config.json", model_type="t5"), "model_type='t5' is not supported")
    refused(edited("generation_config.json", no_repeat_ngram_size=3), "no_repeat_ngram_size=3 is not supported")
    refused(edited("generation_config.json", bad_words_ids=[[3, 4]]), "a sequence of 2 tokens")
    refused(edited("generation_config.json", early_stopping="never"), "early_stopping='never' is not supported")
    refused(FIXTURES / "marian-shared-swish", "the vocabulary has no >>fra<<", "--target-lang", "fra")
    refused(FIXTURES / "marian-shared-swish", "--source-lang is for M2M100", "--source-lang", "en")
    refused(FIXTURES / "m2m100-en-de", "--target-lang xx: this model's languages are af, am", "--target-lang", "xx")
    refused(FIXTURES / "nllb-en-de", "--target-lang deu: this model's languages are", "--target-lang", "deu")
    damaged = edited("config.json")
    (damaged / "source.spm").write_bytes((damaged / "source.spm").read_bytes()[:1000])
    refused(damaged, "a tokenizer file is damaged: not a SentencePiece model")
    weightless = tmp_path / "weightless"
    shutil.copytree(FIXTURES / "marian-shared-swish", weightless, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    refused(weightless, "has no weights")


@pytest.fixture(scope="module")
def m2m100_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("imported") / "m2m100"
    cli_here("import-hf", FIXTURES / "m2m100-en-de", run_dir, "--source-lang", "en", "--target-lang", "de")
    return run_dir


@pytest.mark.slow
def test_an_m2m100_run_translates_into_the_language_it_is_told(m2m100_run):
    """M2M100: pre-LN, fairseq positions, </s> to start, the target language forced first."""
    want, _ = expected("m2m100-en-de")
    result = cli_here("translate", m2m100_run, "--beam-size", "1", *want["sources"][:3])
    assert result.stdout.splitlines() == want["greedy"]["text"][:3]


@pytest.mark.slow
def test_an_m2m100_export_serves_every_language_pair_in_a_fresh_process(m2m100_run, served_exports):
    """`translate_between`, in a process with TensorFlow and tensorflow-text alone, as the run in this one."""
    exported, translations, answers = served_exports["m2m100"]
    assert "languages" in json.loads((exported / "assets.extra" / "translator.json").read_text())
    inputs = M2M100_REQUEST["inputs"]
    translator = translation.load_translator(str(m2m100_run), beam_size=1)
    in_process = translator.translate_between(tf.constant(inputs["text"]), tf.constant(inputs["source_language"]),
                                              tf.constant(inputs["target_language"]))["translation"].numpy()
    assert translations == [text.decode() for text in in_process]
    assert {answer["signature"] for answer in answers} == {"translate_between"}
    named = {answer["answer"] for answer in answers if not answer["request"].startswith("random")}
    assert named == {"InvalidArgumentError"}


# Two language pairs of each multilingual fixture: the one it was saved for, and one with both languages changed.
LANGUAGE_PAIRS = {
    "m2m100-en-de": (("en", "de"), ("de", "fr")),
    "nllb-en-de": (("eng_Latn", "deu_Latn"), ("deu_Latn", "fra_Latn")),
}


# Beam search on one, greedy on the other: the forced first tokens of a beam's rows, and of a greedy row.
@pytest.mark.slow  # two searches traced (test_search.py has the fast proof)
@pytest.mark.parametrize("name, beam_size", [("m2m100-en-de", 4), ("nllb-en-de", 1)])
def test_one_multilingual_translator_translates_each_text_between_its_own_languages(name, beam_size):
    """`translate_between`: each text with its own pair, as Hugging Face or a translator imported for the pair would."""
    want, _ = expected(name)
    pairs = LANGUAGE_PAIRS[name]
    texts = want["sources"][:6]
    languages = [pairs[index % len(pairs)] for index in range(len(texts))]
    model, source_tokenizer, target_tokenizer, decoding = pretrained.load(str(FIXTURES / name))
    translator = Translator(model, source_tokenizer, target_tokenizer, decoding.replace(beam_size=beam_size))
    mixed = translator.translate_between(tf.constant(texts), tf.constant([source for source, _ in languages]),
                                         tf.constant([target for _, target in languages]))
    own_pair, other_pair = pairs
    # The checkpoint's own pair: what Hugging Face's search gave, recorded with the fixture.
    own = [row for row, languages_of_text in enumerate(languages) if languages_of_text == own_pair]
    recorded = want["greedy" if beam_size == 1 else "beam4"]
    assert [theirs(row) for row in mixed["tokens"].numpy()[own]] == [recorded["ids"][row] for row in own]
    assert [text.decode() for text in mixed["translation"].numpy()[own]] == [recorded["text"][row] for row in own]
    # The other pair: the translator a run imported for it has its tokenizers and its forced first token.
    other = [row for row, languages_of_text in enumerate(languages) if languages_of_text == other_pair]
    _, pair_source, pair_target, pair_decoding = pretrained.load(str(FIXTURES / name), *other_pair)
    alone = Translator(model, pair_source, pair_target, pair_decoding.replace(beam_size=beam_size))(
        tf.constant([texts[row] for row in other]))
    assert [row for row in mixed["translation"].numpy()[other]] == list(alone["translation"].numpy())
    assert [theirs(row) for row in mixed["tokens"].numpy()[other]] == [theirs(row) for row in alone["tokens"]]
    np.testing.assert_allclose(mixed["score"].numpy()[other], alone["score"].numpy(), atol=1e-5)
    assert (alone["tokens"].numpy()[:, 0] == pair_target.prefix_ids[0]).all(), "its target language first"


def test_a_language_the_model_lacks_or_a_code_count_unlike_the_texts_is_refused(imported):
    name, (model, source_tokenizer, target_tokenizer, decoding) = imported
    translator = Translator(model, source_tokenizer, target_tokenizer, decoding)
    if name not in LANGUAGE_PAIRS:  # Marian: one pair, or >>xx<< codes in the text itself
        assert translator.languages == []
        with pytest.raises(ValueError, match="name no languages"):
            translator.translate_between(tf.constant(["A dog."]), tf.constant(["en"]), tf.constant(["de"]))
        return
    source, target = LANGUAGE_PAIRS[name][0]
    assert source in translator.languages and target in translator.languages and len(translator.languages) > 90
    for sources, targets, message in (
        ([source], ["xx"], "target_language must be a language code of this model"),
        (["Klingon"], [target], "source_language must be a language code of this model"),
        ([source, source], [target], "source_language must hold one code per text"),
        ([source], [], "target_language must hold one code per text"),
    ):
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            translator.translate_between(tf.constant(["A dog."]), tf.constant(sources, tf.string),
                                         tf.constant(targets, tf.string))


# One fresh process for the exports below (each TensorFlow start costs seconds): for each, the request's
# translations on a "translations:" line, then the malformed-request fuzz (which prints its requests) into its report.
FRESH_PROCESS = r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  registers the SentencePiece ops, as tensorflow_model_server does

jobs_json, tests_dir = sys.argv[1:3]
sys.path.insert(0, tests_dir)
import malformed_requests  # noqa: E402
for export_dir, request, report_path in json.loads(jobs_json):
    loaded = tf.saved_model.load(export_dir)
    inputs = {name: tf.constant(value) for name, value in request["inputs"].items()}
    served = loaded.signatures[request["signature"]](**inputs)
    print("translations:", json.dumps([text.decode() for text in served["translation"].numpy()]))
    sys.stdout.flush()
    malformed_requests.main(export_dir, 0, 20, report_path, request.get("fuzz"), loaded=loaded)
assert "keras_transformer" not in sys.modules
"""

MARIAN_SENTENCES = expected("marian-shared-swish")[0]["sources"][:6] + ["", NON_ASCII]
# Greedy: beam search's first tokens per text are the in-process tests' (above); this is about serving. The
# other signatures' malformed requests go to the Marian run's export.
M2M100_REQUEST = {"signature": "translate_between", "fuzz": ["translate_between"], "inputs": {
    "text": expected("m2m100-en-de")[0]["sources"][:3] + [""],
    "source_language": ["en", "en", "de", "en"], "target_language": ["de", "fr", "en", "es"]}}


@pytest.fixture(scope="module")
def served_exports(imported_run, m2m100_run, tmp_path_factory):
    """The Marian run's export (its beam 4) and the M2M100 run's (greedy), made by `export` and served by one
    process with TensorFlow and tensorflow-text alone: `{name: (version directory, translations, fuzz report)}`."""
    directory = tmp_path_factory.mktemp("served")
    jobs = {"marian": (imported_run, [], {"signature": "serving_default", "inputs": {"text": MARIAN_SENTENCES}}),
            "m2m100": (m2m100_run, ["--beam-size", "1"], M2M100_REQUEST)}
    for name, (run_dir, options, _) in jobs.items():
        cli_here("export", run_dir, directory / name, *options)
    arguments = [[str(directory / name / "1"), request, str(directory / f"{name}.json")]
                 for name, (_, _, request) in jobs.items()]
    result = run([sys.executable, "-c", FRESH_PROCESS, json.dumps(arguments), Path(__file__).parent], check=False)
    assert_it_lived(result)
    printed = [line.removeprefix("translations: ") for line in result.stdout.splitlines()
               if line.startswith("translations: ")]
    return {name: (directory / name / "1", json.loads(printed[index]), json.loads((directory / f"{name}.json").read_text()))
            for index, name in enumerate(jobs)}


@pytest.mark.slow
def test_the_export_of_an_imported_run_serves_the_same_translations_in_a_fresh_process(beam_translations,
                                                                                        served_exports):
    _, translations, answers = served_exports["marian"]
    in_process = [beam_translations[sentence] if sentence else "" for sentence in MARIAN_SENTENCES]  # "" in, "" out
    assert translations == in_process
    assert {answer["answer"] for answer in answers if not answer["request"].startswith("random")} == {
        "InvalidArgumentError"}


@pytest.mark.slow
def test_fine_tuning_an_imported_run_trains_its_weights_with_its_tokenizers(fine_tuned_marian):
    """`train --init-from`: the checkpoint's tokenizers and weights, then a lower loss on the user's pairs."""
    imported_run, out = fine_tuned_marian  # 2 epochs on 160 Multi30k pairs, mirrored (conftest.py)
    history = (out / "history.csv").read_text().splitlines()
    columns = history[0].split(",")
    losses = [float(row.split(",")[columns.index("loss")]) for row in history[1:]]
    assert len(losses) == 2 and losses[1] < losses[0]
    assert json.loads((out / "metrics.json").read_text())["training"]["replicas"] == 2
    for side in ("source", "target"):  # the checkpoint's own tokenizer files, not a learned vocabulary
        assert (out / "vocab" / side / "sentencepiece.model").read_bytes() == (
            imported_run / "vocab" / side / "sentencepiece.model").read_bytes()
    config = translation.load_config(out)
    # The checkpoint's decoding settings, inherited: Hugging Face's length penalty (|Y| ** alpha) and stopping rule.
    assert config["evaluation"]["length_penalty_offset"] == 0 and config["evaluation"]["stop_rule"] == "best_live_is_behind"
    assert config["model"]["position"] == {"columns": "blocked"}  # Marian's sinusoids
    assert cli_here("translate", out, "A man.").stdout.strip()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["marian-shared-swish", "m2m100-en-de"])
def test_the_ctranslate2_export_of_an_imported_run_translates_as_hugging_face(name, tmp_path):
    """Our CTranslate2 conversion keeps the checkpoint's start row, positions, bias and token rules.

    (CTranslate2's own converter starts Marian's decoder from a zero vector, as real OPUS-MT
    checkpoints' <pad> row is: on these fixtures, whose row is random on purpose, it differs.)
    """
    pytest.importorskip("ctranslate2")
    want, _ = expected(name)
    run_dir = tmp_path / "run"
    translation.import_checkpoint(str(FIXTURES / name), str(run_dir))
    translation.export_ctranslate2(str(run_dir), str(tmp_path / "ct2"))
    greedy = translation.translate_with_ctranslate2(str(tmp_path / "ct2"), want["sources"], beam_size=1)
    assert greedy[:-1] == want["greedy"]["text"][:-1] and greedy[-1] == ""
    beam = translation.translate_with_ctranslate2(str(tmp_path / "ct2"), want["sources"])
    assert sum(ours_ == hf for ours_, hf in zip(beam[:-1], want["beam4"]["text"][:-1])) >= 0.9 * (len(beam) - 1)


# -- Hugging Face itself, when it is installed ---------------------------------------------------------


def test_hugging_face_live_gives_the_recorded_outputs():
    """The recorded outputs are what the installed transformers does (skipped where it is not installed)."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    name = "marian-shared-swish"
    want, _ = expected(name)
    model = transformers.MarianMTModel.from_pretrained(FIXTURES / name, dtype=torch.float32).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(FIXTURES / name)
    batch = tokenizer(want["sources"][:8], padding=True, return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(**batch, num_beams=1, max_length=24)
    texts = tokenizer.batch_decode(generated, skip_special_tokens=True)
    translator = pretrained.load_translator(str(FIXTURES / name), beam_size=1)
    assert translator.translate(want["sources"][:8]) == texts
