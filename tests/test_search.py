"""Decoding: the cached search agrees with recomputation, beam search with greedy."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.inference import Translator, beam_search, greedy_search, score_sequences
from keras_transformer.text import WordPieceTokenizer

START, END = 2, 3
CONFIG = dict(src_vocab_size=40, tgt_vocab_size=50, num_layers=2, d_model=32, num_heads=4, d_ff=64, max_length=30, dropout=0.0)


def sources(seed=0, batch=6, length=7):
    ids = np.random.default_rng(seed).integers(4, 40, (batch, length)).astype("int32")
    for row in range(batch):
        ids[row, length - row % 4 :] = 0  # different source lengths
    return ids


@pytest.fixture(scope="module")
def model():
    # Module fixtures are built before the per-test seed: seed here too.
    keras.utils.set_random_seed(1)
    model = kt.models.Transformer(**CONFIG)
    model.build(((None, None), (None, None)))
    # Raise the [END] logit until some sentences of a batch end with [END] and
    # others run to their length limit: both ways of finishing get exercised.
    bias = model.output_projection.bias.numpy()
    for end_bias in np.arange(0.0, 3.0, 0.05):
        bias[END] = end_bias
        model.output_projection.bias.assign(bias)
        tokens, _ = greedy_search(model, sources(1), START, END, max_extra_length=3)
        ended = [END in row for row in tokens.numpy()]
        if any(ended) and not all(ended):
            return model
    raise AssertionError("no [END] bias gives a batch with both kinds of ending")


def test_cached_greedy_equals_greedy_recomputing_the_prefix(model):
    for seed in range(3):
        ids = sources(seed)
        cached_tokens, cached_scores = tf.function(
            lambda x: greedy_search(model, x, START, END, max_extra_length=6))(ids)
        plain_tokens, plain_scores = tf.function(
            lambda x: greedy_search(model, x, START, END, max_extra_length=6, use_cache=False))(ids)
        np.testing.assert_array_equal(cached_tokens.numpy(), plain_tokens.numpy())
        np.testing.assert_allclose(cached_scores.numpy(), plain_scores.numpy(), atol=1e-5)


def test_sentences_finish_at_different_steps_and_respect_their_limits(model):
    ids = sources(1)
    tokens, _ = tf.function(lambda x: greedy_search(model, x, START, END, max_extra_length=3))(ids)
    tokens = tokens.numpy()
    source_lengths = (ids != 0).sum(1)
    lengths = (tokens != 0).sum(1)
    assert np.all(lengths <= source_lengths + 3)
    for row, length in zip(tokens, lengths):
        assert np.all(row[length:] == 0)  # nothing after the end
        assert END not in row[: length - 1]
    assert len(set(lengths)) > 1
    assert any(END in row for row in tokens) and not all(END in row for row in tokens)


def test_batch_composition_does_not_change_a_translation(model):
    ids = sources(2)
    batched, _ = greedy_search(model, ids, START, END, max_extra_length=6)
    for row in range(len(ids)):
        alone, _ = greedy_search(model, ids[row : row + 1], START, END, max_extra_length=6)
        length = alone.shape[1]
        np.testing.assert_array_equal(batched.numpy()[row, :length], alone.numpy()[0])
        assert np.all(batched.numpy()[row, length:] == 0)


def test_beam_of_one_is_greedy(model):
    ids = sources(3)
    greedy_tokens, greedy_scores = tf.function(lambda x: greedy_search(model, x, START, END, max_extra_length=6))(ids)
    beam_tokens, beam_scores = tf.function(
        lambda x: beam_search(model, x, START, END, beam_size=1, max_extra_length=6))(ids)
    np.testing.assert_array_equal(beam_tokens.numpy(), greedy_tokens.numpy())
    np.testing.assert_allclose(beam_scores.numpy(), greedy_scores.numpy(), atol=1e-5)


@pytest.mark.parametrize("beam_size", [2, 4])
def test_beam_search_never_scores_worse_than_greedy(model, beam_size):
    for seed in range(3):
        ids = sources(10 + seed)
        greedy_tokens, _ = greedy_search(model, ids, START, END, max_extra_length=6)
        beam_tokens, beam_scores = tf.function(
            lambda x: beam_search(model, x, START, END, beam_size=beam_size, max_extra_length=6))(ids)
        # Scores recomputed from scratch with a teacher-forced pass.
        greedy_model_scores = score_sequences(model, ids, greedy_tokens, START).numpy()
        beam_model_scores = score_sequences(model, ids, beam_tokens, START).numpy()
        np.testing.assert_allclose(beam_model_scores, beam_scores.numpy(), atol=1e-4)
        assert np.all(beam_model_scores >= greedy_model_scores - 1e-5)


def test_cached_beam_equals_recomputed_beam(model):
    ids = sources(4)
    cached = tf.function(lambda x: beam_search(model, x, START, END, beam_size=3, max_extra_length=5))(ids)
    plain = tf.function(lambda x: beam_search(model, x, START, END, beam_size=3, max_extra_length=5, use_cache=False))(ids)
    np.testing.assert_array_equal(cached[0].numpy(), plain[0].numpy())
    np.testing.assert_allclose(cached[1].numpy(), plain[1].numpy(), atol=1e-5)


def test_bad_beam_size(model):
    with pytest.raises(ValueError, match="beam_size must be at least 1"):
        beam_search(model, sources(), START, END, beam_size=0)


@pytest.fixture(scope="module")
def translator_parts():
    # Texts with a small alphabet, so the vocabularies fit the tiny model.
    source = WordPieceTokenizer.learn(["Ein Hund, ein Hund.", "Hund und Hund!"] * 3, vocab_size=40)
    target = WordPieceTokenizer.learn(["a dog, a dog.", "dog and god!"] * 3, vocab_size=50)
    model = kt.models.Transformer(**{**CONFIG, "src_vocab_size": source.vocab_size, "tgt_vocab_size": target.vocab_size})
    return model, source, target


def test_translator_checks_vocabulary_sizes(model, translator_parts):
    _, source, target = translator_parts
    with pytest.raises(ValueError, match="model's source vocabulary has 40 ids but the source tokenizer has"):
        Translator(model, source, target)


def test_out_of_vocabulary_ids_detokenize_as_unknown(translator_parts):
    _, _, target = translator_parts
    text = target.detokenize([[target.vocab.index("dog"), 10_000, 3]]).numpy()[0].decode()
    assert text == "dog [UNK]"


@pytest.mark.parametrize("beam_size", [1, 3])
def test_translator_handles_empty_long_and_odd_input(translator_parts, beam_size):
    model, source, target = translator_parts
    translator = Translator(model, source, target, beam_size=beam_size, max_extra_length=4)
    long_text = " ".join(["Hund"] * 100)
    outputs = translator(tf.constant(["Ein Hund.", "", long_text, b"Der \xff Mann"]))
    translations = outputs["translation"].numpy()
    assert translations[1] == b""  # empty in, empty out
    assert outputs["score"].numpy()[1] == 0.0
    assert translations.shape == (4,) and np.all(np.isfinite(outputs["score"].numpy()))
    # The long source was cut to max_length: at most max_length + 4 tokens come out.
    assert (outputs["tokens"].numpy()[2] != 0).sum() <= model.max_length
    assert translator.translate(["Ein Hund."]) == [translations[0].decode()]
    assert translator(tf.constant([], tf.string))["translation"].shape == (0,)


def test_source_truncation_keeps_the_end_token(translator_parts):
    model, source, target = translator_parts
    translator = Translator(model, source, target, beam_size=1)
    ids = translator.source_ids(tf.constant([" ".join(["Hund"] * 100), "Ein Hund."])).numpy()
    assert ids.shape[1] == model.max_length
    assert ids[0, -1] == source.end_id and ids[0, 0] == source.start_id
    assert list(ids[1]).count(source.end_id) == 1


@pytest.mark.parametrize("beam_size", [1, 2])
def test_translate_with_attention_explains_the_translation_it_returns(translator_parts, beam_size):
    model, source, target = translator_parts
    translator = Translator(model, source, target, beam_size=beam_size, max_extra_length=5)
    texts = tf.constant(["Ein Hund und ein Hund.", "Hund!", ""])
    plain = translator(texts)
    outputs = translator.translate_with_attention(texts)
    np.testing.assert_array_equal(outputs["translation"].numpy(), plain["translation"].numpy())
    np.testing.assert_array_equal(outputs["tokens"].numpy(), plain["tokens"].numpy())

    tokens = outputs["tokens"].numpy()
    source_ids = translator.source_ids(texts).numpy()
    attention = outputs["cross_attention"].numpy()
    assert attention.shape == (3, model.num_layers, model.num_heads, tokens.shape[1], source_ids.shape[1])
    # Tokens are trimmed to the longest output; the empty source has none.
    assert (tokens != 0).sum(axis=1).max() == tokens.shape[1] and (tokens[2] == 0).all()
    real_rows = tokens != 0
    row_sums = attention.sum(axis=-1)
    np.testing.assert_allclose(row_sums[real_rows.nonzero()[0], :, :, real_rows.nonzero()[1]], 1.0, atol=1e-5)
    assert np.all(row_sums[~real_rows[:, None, None, :].repeat(2, 1).repeat(4, 2)] == 0.0)
    # No attention goes to padded source positions.
    assert np.abs(attention * (source_ids == 0)[:, None, None, None, :]).max() < 1e-6

    expected_source = np.where(source_ids == 0, b"", source.id_to_token(source_ids).numpy())
    np.testing.assert_array_equal(outputs["source_tokens"].numpy(), expected_source)
    assert outputs["source_tokens"].numpy()[1, 0] == b"[START]"
    expected_target = np.where(tokens == 0, b"", target.id_to_token(tokens).numpy())
    np.testing.assert_array_equal(outputs["target_tokens"].numpy(), expected_target)


def test_max_output_length_caps_every_output(translator_parts):
    model, source, target = translator_parts
    translator = Translator(model, source, target, beam_size=2, max_output_length=3)
    tokens = translator(tf.constant(["Ein Hund und ein Hund und ein Hund."]))["tokens"].numpy()
    assert (tokens != 0).sum() <= 3
    with pytest.raises(ValueError, match=r"max_output_length must be between 1 and the model's max_length \(30\)"):
        Translator(model, source, target, max_output_length=31)


def test_cached_search_under_mixed_bfloat16():
    import keras

    keras.config.set_dtype_policy("mixed_bfloat16")
    model = kt.models.Transformer(**CONFIG)
    ids = sources(5)
    for search in (greedy_search, beam_search):
        cached = tf.function(lambda x: search(model, x, START, END, max_extra_length=4))(ids)
        plain = tf.function(lambda x: search(model, x, START, END, max_extra_length=4, use_cache=False))(ids)
        assert cached[1].dtype == tf.float32 and np.all(np.isfinite(cached[1].numpy()))
        # bfloat16 rounding differs between the two paths; most tokens agree.
        assert np.mean(cached[0].numpy() == plain[0].numpy()) > 0.8
