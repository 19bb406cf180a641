"""Decoding: the cached search agrees with recomputation, beam search with greedy."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.inference import (
    DecodingSettings,
    LengthPenalty,
    TokenRules,
    Translator,
    beam_search,
    greedy_search,
    higher_scoring,
    num_steps,
    output_limits,
    score_sequences,
    transformer_search,
    transformer_step,
)
from keras_transformer.export.litert import cache as litert_cache
from keras_transformer.export.litert.decoding import LiteRTDecoding, spelled_out_log_softmax
from keras_transformer.inference import decoding as runtime_decoding
from keras_transformer.inference import steps as decoding_steps
from keras_transformer.inference.search import top_log_probs
from keras_transformer.inference.settings import TokenRules
from keras_transformer.inference.tracing import graph_function
from keras_transformer.text import WordPieceTokenizer

START, END = 2, 3


def decoding(length_alpha=0.6, ids=(START, END), beam_size=1, **settings):
    """`DecodingSettings` for this file's vocabularies: greedy unless asked (`length_alpha`: GNMT's penalty's)."""
    return DecodingSettings(beam_size, LengthPenalty(length_alpha), **settings).for_output(*ids)

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
    # Traced once: each call reads the bias variable as it now is.
    search = graph_function(lambda ids: transformer_search(model, ids, decoding(max_extra_length=3)))
    for end_bias in np.arange(0.0, 3.0, 0.05):
        bias[END] = end_bias
        model.output_projection.bias.assign(bias)
        tokens, _ = search(sources(1))
        ended = [END in row for row in tokens.numpy()]
        if any(ended) and not all(ended):
            return model
    raise AssertionError("no [END] bias gives a batch with both kinds of ending")


@pytest.fixture(params=["initial room", "room of 2"])
def cache_room(request, monkeypatch):
    """The decoding cache's first room: as shipped, or 2 positions, so that it grows (2, 4, 8, ...) mid-search."""
    if request.param == "room of 2":
        monkeypatch.setattr(runtime_decoding, "INITIAL_CACHE_ROOM", 2)
    return request.param


@pytest.fixture(scope="module")
def recomputed(model):
    """Searches that recompute the whole prefix each step (no cache, so no cache room to vary): greedy on
    `sources(seed)` for seeds 0-2 (`"greedy", seed`), beam 3 on `sources(4)` (`"beam"`)."""
    greedy = graph_function(lambda x: transformer_search(model, x, decoding(max_extra_length=6), use_cache=False))
    beam = graph_function(lambda x: transformer_search(model, x, decoding(beam_size=3, max_extra_length=5),
                                                       use_cache=False))
    return {**{("greedy", seed): greedy(sources(seed)) for seed in range(3)}, "beam": beam(sources(4))}


def test_cached_greedy_equals_greedy_recomputing_the_prefix(model, recomputed, cache_room):
    # Traced once: the three batches have one shape.
    cached_search = graph_function(lambda x: transformer_search(model, x, decoding(max_extra_length=6)))
    for seed in range(3):
        cached_tokens, cached_scores = cached_search(sources(seed))
        plain_tokens, plain_scores = recomputed["greedy", seed]
        np.testing.assert_array_equal(cached_tokens.numpy(), plain_tokens.numpy())
        np.testing.assert_allclose(cached_scores.numpy(), plain_scores.numpy(), atol=1e-5)


def test_sentences_finish_at_different_steps_and_respect_their_limits(model):
    ids = sources(1)
    tokens, _ = graph_function(lambda x: transformer_search(model, x, decoding(max_extra_length=3)))(ids)
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
    batched, _ = transformer_search(model, ids, decoding(max_extra_length=6))
    for row in range(len(ids)):
        alone, _ = transformer_search(model, ids[row : row + 1], decoding(max_extra_length=6))
        length = alone.shape[1]
        np.testing.assert_array_equal(batched.numpy()[row, :length], alone.numpy()[0])
        assert np.all(batched.numpy()[row, length:] == 0)


def test_beam_of_one_is_greedy(model):
    ids = sources(3)

    def search(x, beam_search_of_one=False):
        settings = decoding(max_extra_length=6, keep_greedy=False)
        max_lengths = output_limits(model, x, settings)
        step_fn, cache, context = transformer_step(model, x, num_steps(max_lengths))
        search = beam_search if beam_search_of_one else greedy_search
        return search(step_fn, cache, max_lengths, settings, context=context)

    greedy_tokens, greedy_scores = graph_function(search)(ids)
    beam_tokens, beam_scores = graph_function(lambda x: search(x, beam_search_of_one=True))(ids)
    np.testing.assert_array_equal(beam_tokens.numpy(), greedy_tokens.numpy())
    np.testing.assert_allclose(beam_scores.numpy(), greedy_scores.numpy(), atol=1e-5)


@pytest.mark.parametrize("beam_size", [2, 4])
def test_beam_search_never_scores_worse_than_greedy(model, beam_size):
    greedy_search_ = graph_function(lambda x: transformer_search(model, x, decoding(max_extra_length=6)))
    beam_search_ = graph_function(lambda x: transformer_search(model, x, decoding(beam_size=beam_size, max_extra_length=6)))
    for seed in range(3):
        ids = sources(10 + seed)
        greedy_tokens, _ = greedy_search_(ids)
        beam_tokens, beam_scores = beam_search_(ids)
        # Scores recomputed from scratch with a teacher-forced pass.
        greedy_model_scores = score_sequences(model, ids, greedy_tokens, START).numpy()
        beam_model_scores = score_sequences(model, ids, beam_tokens, START).numpy()
        np.testing.assert_allclose(beam_model_scores, beam_scores.numpy(), atol=1e-4)
        assert np.all(beam_model_scores >= greedy_model_scores - 1e-5)


def test_cached_beam_equals_recomputed_beam(model, recomputed, cache_room):
    cached = graph_function(lambda x: transformer_search(model, x, decoding(beam_size=3, max_extra_length=5)))(sources(4))
    plain = recomputed["beam"]
    np.testing.assert_array_equal(cached[0].numpy(), plain[0].numpy())
    np.testing.assert_allclose(cached[1].numpy(), plain[1].numpy(), atol=1e-5)


def test_a_tied_output_decodes_as_recomputation_does():
    # With tie_output the decoding step multiplies by the embeddings transposed once per search
    # (tied_output_kernel); recomputation takes the model's own path.
    keras.utils.set_random_seed(2)
    tied = kt.models.Transformer(**{**CONFIG, "src_vocab_size": 50, "share_embeddings": True, "tie_output": True})
    tied.build(((None, None), (None, None)))
    ids = sources(5)
    for beam_size in (1, 3):
        settings = decoding(beam_size=beam_size, max_extra_length=5)
        cached = graph_function(lambda x: transformer_search(tied, x, settings))(ids)
        plain = graph_function(lambda x: transformer_search(tied, x, settings, use_cache=False))(ids)
        np.testing.assert_array_equal(cached[0].numpy(), plain[0].numpy())
        np.testing.assert_allclose(cached[1].numpy(), plain[1].numpy(), atol=1e-5)
        teacher_forced = score_sequences(tied, ids, cached[0], START)
        np.testing.assert_allclose(cached[1].numpy(), teacher_forced.numpy(), atol=1e-4)


def test_a_cache_settled_in_chunks_is_refused_where_it_cannot_run(model):
    """LiteRT's searches decode on a cache in two parts that grows between chunks: elsewhere it is refused."""
    ids = sources()
    with pytest.raises(ValueError, match="grows between chunks"):
        transformer_search(model, ids, decoding(beam_size=2), static_shapes=True, decoding=LiteRTDecoding(4))
    with pytest.raises(ValueError, match="key/value cache"):
        transformer_search(model, ids, decoding(), use_cache=False, decoding=LiteRTDecoding(4))
    # A cache laid out for beams (by sentence), stepped as one row a sentence's.
    _, cache, source = decoding_steps.transformer_step(model, ids, 4, rows_per_source=2, decoding=LiteRTDecoding(4))
    with pytest.raises(ValueError, match="for 1 row\\(s\\) a sentence has 4 parts"):
        model.decode_step(tf.fill([2 * ids.shape[0], 1], START), cache, 0, source,
                          cache_policy=litert_cache.TwoPartCache(rows_per_source=1))


def _written_along_by_tensorflow(cached, new, index, axis):
    """LiteRT's block write (`export.litert.cache.write_along`), as ops TensorFlow runs without XLA."""
    size = tf.shape(cached)[axis]
    before = tf.gather(cached, tf.range(index), axis=axis)
    after = tf.gather(cached, tf.range(index + tf.shape(new)[axis], size), axis=axis)
    return tf.concat([before, tf.cast(new, cached.dtype), after], axis=axis)


# What the chunked searches are compared with: (beam size, greedy path kept), at most 4 tokens past the
# source; and a one-step limit, where every sentence finishes at the first step.
CHUNKED_SETTINGS = {(1, False): decoding(max_extra_length=4), (3, True): decoding(beam_size=3, keep_greedy=True,
                    max_extra_length=4), (2, False): decoding(beam_size=2, max_extra_length=4),
                    "one step": decoding(max_extra_length=0, max_output_length=1)}


@pytest.fixture(scope="module")
def ordinary_searches(model):
    """The ordinary searches' `(tokens, scores)` of `sources(3)` under each of `CHUNKED_SETTINGS`."""
    ids = sources(3, batch=6)
    return {name: graph_function(lambda x: transformer_search(model, x, settings))(ids)
            for name, settings in CHUNKED_SETTINGS.items()}


@pytest.mark.parametrize("chunk_steps", [1, 3])
def test_searches_in_chunks_translate_as_the_ordinary_searches(model, ordinary_searches, monkeypatch, chunk_steps):
    """LiteRT's searches: chunks of steps on a two-part cache that grows, sentences leaving between chunks.

    Run by TensorFlow, with its own ops for LiteRT's one write. Chunks of 3
    divide no length limit here: sentences end mid-chunk, and the last
    chunk is cut short; with a one-step limit the batch empties in the first chunk.
    """
    monkeypatch.setattr(litert_cache, "write_along", _written_along_by_tensorflow)
    ids = sources(3, batch=6)
    litert = LiteRTDecoding(chunk_steps)
    for name, settings in CHUNKED_SETTINGS.items():
        ordinary = ordinary_searches[name]
        chunked = graph_function(lambda x: transformer_search(model, x, settings, decoding=litert))(ids)
        np.testing.assert_array_equal(chunked[0].numpy(), ordinary[0].numpy())
        if name != "one step":
            np.testing.assert_allclose(chunked[1].numpy(), ordinary[1].numpy(), atol=1e-5)


def test_the_log_softmax_spelled_out_for_litert_equals_tensorflows():
    logits = tf.constant(np.random.default_rng(0).normal(scale=20.0, size=(3, 1000)), tf.float32)
    np.testing.assert_allclose(spelled_out_log_softmax(logits).numpy(), tf.nn.log_softmax(logits).numpy(),
                               rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("vocab_size", [58101, 10000, 1000])
@pytest.mark.parametrize("renormalize", [False, True])
def test_the_candidates_found_in_blocks_for_litert_are_tensorflows_top_k(vocab_size, renormalize):
    # LiteRT's candidates come from the k blocks with the largest maxima: the same ids, in the same
    # order, as a top-k over all the log-probabilities, with a forbidden id the largest logit of a
    # row and equal logits in others (equal ones go to the lower id).
    rules = TokenRules(start_id=2, end_id=3, never=(0, 2, 57), renormalize=renormalize)
    logits = np.random.default_rng(vocab_size).normal(scale=5.0, size=(5, vocab_size)).astype(np.float32)
    logits[0, 57] = 100.0
    logits[1] = np.round(logits[1])
    logits[2] = -10.0  # the largest logit in the last block, one equal to the second largest in the first
    logits[2, [10, vocab_size - 5, vocab_size - 4]] = [1.0, 2.0, 1.0]
    for k in (1, 8):
        expected = top_log_probs(tf.constant(logits), k, rules)
        found = LiteRTDecoding().top_log_probs(tf.constant(logits), k, rules)
        np.testing.assert_array_equal(found[1].numpy(), expected[1].numpy())
        np.testing.assert_allclose(found[0].numpy(), expected[0].numpy(), rtol=1e-6, atol=1e-5)
        assert not np.isin(found[1].numpy(), rules.never).any()


def test_bad_beam_size(model):
    with pytest.raises(ValueError, match="beam_size must be at least 1"):
        decoding(beam_size=0)


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
    translator = Translator(model, source, target, DecodingSettings(beam_size=beam_size, max_extra_length=4))
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
    translator = Translator(model, source, target, DecodingSettings(beam_size=1))
    ids = translator.source_ids(tf.constant([" ".join(["Hund"] * 100), "Ein Hund."])).numpy()
    assert ids.shape[1] == model.max_length
    assert ids[0, -1] == source.end_id and ids[0, 0] == source.start_id
    assert list(ids[1]).count(source.end_id) == 1


@pytest.mark.parametrize("beam_size", [1, 2])
def test_translate_with_attention_explains_the_translation_it_returns(translator_parts, beam_size):
    model, source, target = translator_parts
    translator = Translator(model, source, target, DecodingSettings(beam_size=beam_size, max_extra_length=5))
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
    translator = Translator(model, source, target, DecodingSettings(beam_size=2, max_output_length=3))
    tokens = translator(tf.constant(["Ein Hund und ein Hund und ein Hund."]))["tokens"].numpy()
    assert (tokens != 0).sum() <= 3
    with pytest.raises(ValueError, match=r"max_output_length must be between 1 and the model's max_length \(30\)"):
        Translator(model, source, target, DecodingSettings(max_output_length=31))


def test_cached_search_under_mixed_bfloat16():
    import keras

    keras.config.set_dtype_policy("mixed_bfloat16")
    model = kt.models.Transformer(**CONFIG)
    ids = sources(5)
    for beam_size in (1, 4):
        cached = graph_function(lambda x: transformer_search(model, x, decoding(beam_size=beam_size, max_extra_length=4)))(ids)
        plain = graph_function(
            lambda x: transformer_search(model, x, decoding(beam_size=beam_size, max_extra_length=4), use_cache=False))(ids)
        assert cached[1].dtype == tf.float32 and np.all(np.isfinite(cached[1].numpy()))
        # bfloat16 rounding differs between the two paths; most tokens agree.
        assert np.mean(cached[0].numpy() == plain[0].numpy()) > 0.8


# The searches on their own: driven by hand-written step functions over fixed
# tables of next-token probabilities, with no Transformer anywhere.
PAD, TOY_START, TOY_END, A, B = 0, 1, 2, 3, 4


def toy_table(rows, vocab=5):
    """`table[previous, newest]`: the next token's probabilities; [END] is likely unless `rows` says otherwise."""
    table = np.zeros([vocab, vocab, vocab], np.float32)
    table[..., TOY_END], table[..., A], table[..., B] = 0.9, 0.05, 0.05
    for (previous, newest), probabilities in rows.items():
        table[previous, newest] = [probabilities.get(token, 0.0) for token in range(vocab)]
    return table


def toy_step(table):
    """A trigram model as a step function: its cache holds each row's previous token."""
    log_table = tf.math.log(tf.convert_to_tensor(table, tf.float32))  # an array, or a graph's input

    def step_fn(tokens, cache, index, context):
        logits = tf.gather_nd(log_table, tf.stack([cache["previous"], tokens], axis=1))
        return logits, {"previous": tokens}

    return step_fn


def toy_cache(previous, beams=1):
    return {"previous": tf.repeat(tf.constant(previous, tf.int32), beams)}  # every beam of a sentence starts alike


def toy_scores(table, previous_tokens, tokens, alpha):
    """Teacher-forced length-normalised log-probabilities of `tokens` under the trigram `table`."""
    scores = []
    for previous, row in zip(previous_tokens, tokens):
        newest, total, length = TOY_START, 0.0, 0
        for token in row[row != 0]:
            probabilities = table[previous, newest].astype(np.float64)
            total += np.log(probabilities[token] / probabilities.sum())
            previous, newest, length = newest, token, length + 1
        scores.append(total / ((5 + length) / 6) ** alpha)
    return np.array(scores)


TOY_TABLE = toy_table({
    # Sentence 0 (starting after [PAD]): greedy search takes A, the better pair starts with B.
    (PAD, TOY_START): {A: 0.5, B: 0.4, TOY_END: 0.1},
    (TOY_START, A): {TOY_START: 0.4, A: 0.22, B: 0.2, TOY_END: 0.18},  # [START] is never generated
    (TOY_START, B): {TOY_END: 0.9, A: 0.05, B: 0.05},
    # Sentence 1 (starting after B): ending at once is likelier than "B [END]", but shorter.
    (B, TOY_START): {TOY_END: 0.52, B: 0.479, A: 0.001},
})
TOY_FIRST = [PAD, B]  # each sentence's token before [START]


def toy(**settings):
    """`DecodingSettings` for the toy vocabulary; beam search without the greedy path unless asked."""
    return decoding(ids=(TOY_START, TOY_END), **{"keep_greedy": False, **settings})
TOY_MAX_LENGTHS = [2, 3]


@pytest.mark.parametrize("length_alpha", [0.6, 2.0])
def test_greedy_search_on_a_hand_written_step_function(length_alpha):
    search = graph_function(lambda cache: greedy_search(
        toy_step(TOY_TABLE), cache, TOY_MAX_LENGTHS, toy(length_alpha=length_alpha)))
    tokens, scores = search(toy_cache(TOY_FIRST))
    # Sentence 0 stops at its limit of 2 tokens without [END]; sentence 1 ends at once.
    np.testing.assert_array_equal(tokens.numpy(), [[A, A, 0], [TOY_END, 0, 0]])
    expected = [np.log(0.5 * 0.22) / (7 / 6) ** length_alpha, np.log(0.52)]
    np.testing.assert_allclose(scores.numpy(), expected, rtol=1e-5)


@pytest.mark.parametrize("length_alpha, sentence_1", [(0.0, [TOY_END, 0, 0]), (0.6, [TOY_END, 0, 0]), (2.0, [B, TOY_END, 0])])
def test_beam_search_on_a_hand_written_step_function(length_alpha, sentence_1):
    beams = 2
    search = graph_function(lambda cache: beam_search(
        toy_step(TOY_TABLE), cache, TOY_MAX_LENGTHS, toy(beam_size=beams, length_alpha=length_alpha)))
    tokens, scores = search(toy_cache(TOY_FIRST, beams))
    # Sentence 0: "B [END]" (0.4 * 0.9) beats greedy's "A A" (0.5 * 0.22). Sentence 1:
    # "[END]" (0.52) against "B [END]" (0.479 * 0.9): the length penalty decides.
    np.testing.assert_array_equal(tokens.numpy(), [[B, TOY_END, 0], sentence_1])
    np.testing.assert_allclose(scores.numpy(), toy_scores(TOY_TABLE, TOY_FIRST, tokens.numpy(), length_alpha), rtol=1e-5)
    assert scores.numpy()[1] == pytest.approx(
        np.log(0.52) if sentence_1[0] == TOY_END else np.log(0.479 * 0.9) / (7 / 6) ** length_alpha, rel=1e-5)


def test_searching_on_after_the_beam_is_full_stops_where_hugging_faces_heuristic_does():
    # Beam 2, Hugging Face's length penalty (sum / length). After step 1, "[END]" and "A [END]" have
    # ended and the live "B A" scores log(0.2 * 0.99) / 2 at its present length, below both: Hugging
    # Face's heuristic (early_stopping=False) stops there and returns "A [END]". "B A [END]" would have
    # scored higher, log(0.2 * 0.99 * 0.99) / 3: a search that waited for every possible winner finds it.
    table = toy_table({
        (PAD, TOY_START): {TOY_END: 0.5, A: 0.3, B: 0.2},
        (TOY_START, A): {TOY_END: 0.9, A: 0.05, B: 0.05},
        (TOY_START, B): {A: 0.99, TOY_END: 0.01},
        (B, A): {TOY_END: 0.99, A: 0.01},
    })
    settings = toy(beam_size=2, stop_rule="best_live_is_behind").replace(length_penalty=LengthPenalty(1.0, offset=0))
    tokens, scores = beam_search(toy_step(table), toy_cache([PAD], 2), [5], settings)
    np.testing.assert_array_equal(tokens.numpy()[0, :2], [A, TOY_END])
    assert not tokens.numpy()[0, 2:].any()
    assert scores.numpy()[0] == pytest.approx(np.log(0.3 * 0.9) / 2, rel=1e-5)
    assert np.log(0.2 * 0.99 * 0.99) / 3 > np.log(0.3 * 0.9) / 2


def test_searches_return_what_a_random_step_function_scores_them():
    # A random trigram: the cache must follow every row (and every reordered
    # beam), or the returned scores would not be those of the returned tokens.
    # Beam 4 keeps 8 candidates a row, more than the vocabulary holds.
    vocab, alpha = 7, 0.6
    table = np.random.default_rng(0).dirichlet(np.full(vocab, 0.5), size=(vocab, vocab)).astype(np.float32)
    first, max_lengths = [3, 4, 5, 6, 0], [1, 3, 4, 5, 6]
    step_fn = toy_step(table)
    greedy = graph_function(lambda cache: greedy_search(step_fn, cache, max_lengths, toy(length_alpha=alpha)))(
        toy_cache(first, 1))
    for beams in (1, 2, 3, 4):
        found = graph_function(lambda cache: beam_search(
            step_fn, cache, max_lengths, toy(beam_size=beams, length_alpha=alpha)))(toy_cache(first, beams))
        if beams == 1:
            np.testing.assert_array_equal(found[0].numpy(), greedy[0].numpy())
        for tokens, scores in (greedy, found):
            tokens = tokens.numpy()
            np.testing.assert_allclose(scores.numpy(), toy_scores(table, first, tokens, alpha), rtol=1e-4)
            lengths = (tokens != 0).sum(axis=1)
            assert np.all(lengths <= max_lengths) and np.all(lengths >= 1)
            for row, length in zip(tokens, lengths):
                assert np.all(row[length:] == 0) and TOY_END not in row[: length - 1]
                assert TOY_START not in row


@pytest.mark.parametrize("beams, early_stop", [(1, True), (2, True), (2, False), (3, True)])
def test_the_greedy_path_beside_the_beams_returns_the_better_of_both_searches(beams, early_stop, monkeypatch):
    # keep_greedy follows the greedy path as one more row per sentence, in the
    # beam search's own steps: exactly the better of the two searches run apart.
    if not early_stop:
        never_beaten(monkeypatch)
    # In a graph, as the export runs it: traced once, each seed's table and limits its inputs.
    together_in_graph = graph_function(lambda cache, table, max_lengths: beam_search(
        toy_step(table), cache, max_lengths, toy(beam_size=beams, keep_greedy=True)), reduce_retracing=True)
    greedy_won = 0
    for seed in range(8):
        rng = np.random.default_rng(seed)
        vocab = int(rng.integers(6, 12))
        table = rng.dirichlet(np.full(vocab, 0.3), size=(vocab, vocab)).astype(np.float32)
        first = rng.integers(0, vocab, 5).tolist()
        max_lengths = rng.integers(1, 12, 5).tolist()
        beams_only = beam_search(toy_step(table), toy_cache(first, beams), max_lengths, toy(beam_size=beams))
        greedy = greedy_search(toy_step(table), toy_cache(first), max_lengths, toy())
        apart = higher_scoring(beams_only, greedy)
        together = together_in_graph(toy_cache(first, beams + 1), table, tf.constant(max_lengths))
        np.testing.assert_array_equal(together[0].numpy(), apart[0].numpy())
        np.testing.assert_allclose(together[1].numpy(), apart[1].numpy(), rtol=1e-6)
        greedy_won += int(np.sum(greedy[1].numpy() > beams_only[1].numpy()))
    if beams > 1:
        assert greedy_won > 0  # the greedy row made a difference somewhere


@pytest.mark.parametrize("beams, keep_greedy", [(1, False), (3, False), (3, True)])
def test_each_sentence_starts_with_its_own_forced_token_as_if_searched_alone(beams, keep_greedy):
    # `first_ids`: a forced first token per sentence (a request's target language). Sentences of
    # different limits leave the batch at different steps; each must still get exactly what a
    # search of it alone, its token forced for all (`TokenRules.forced_first`), gets.
    rng = np.random.default_rng(3)
    vocab = 8
    table = rng.dirichlet(np.full(vocab, 0.4), size=(vocab, vocab)).astype(np.float32)
    first, max_lengths, first_ids = [3, 4, 5, 6, 7], [1, 4, 2, 6, 3], [5, 3, 7, 3, 6]
    rows = beams + keep_greedy

    def search(previous, limits, rules, **first):
        settings = toy(beam_size=beams, keep_greedy=keep_greedy, token_rules=rules)
        if beams == 1:
            return greedy_search(toy_step(table), toy_cache(previous), limits, settings, **first)
        return beam_search(toy_step(table), toy_cache(previous, rows), limits, settings, **first)

    ours = TokenRules.ours(TOY_START, TOY_END)
    together = graph_function(lambda ids: search(first, max_lengths, ours, first_ids=ids))(tf.constant(first_ids))
    assert together[0].numpy()[:, 0].tolist() == first_ids
    for index, (previous, limit, token) in enumerate(zip(first, max_lengths, first_ids)):
        alone = search([previous], [limit], dataclasses.replace(ours, forced_first=token))
        width = alone[0].shape[1]
        np.testing.assert_array_equal(together[0].numpy()[index, :width], alone[0].numpy()[0])
        assert not together[0].numpy()[index, width:].any()
        np.testing.assert_allclose(together[1].numpy()[index], alone[1].numpy()[0], rtol=1e-6)


def sentence_tables_step(tables, rows_per_source, rows_seen=None):
    """A trigram model per sentence: the context says which table each sentence's rows read (its own)."""
    log_tables = tf.math.log(tf.convert_to_tensor(tables, tf.float32))  # an array, or a graph's input

    def step_fn(tokens, cache, index, context):
        if rows_seen is not None:
            rows_seen.append(int(tf.size(tokens)))
        # The context holds a row per sentence; its rows (beams) follow one another.
        table = tf.repeat(context["table"], rows_per_source)
        logits = tf.gather_nd(log_tables, tf.stack([table, cache["previous"], tokens], axis=1))
        return logits, {"previous": tokens}

    return step_fn


@pytest.mark.parametrize("beams, keep_greedy", [(1, False), (2, False), (2, True), (3, True)])
def test_dropping_finished_sentences_changes_no_result_and_saves_their_steps(beams, keep_greedy):
    # Each sentence reads its own random table through the context: a row that
    # read another sentence's context after the batch shrank would search on
    # the wrong model. Greedy search for beams=1.
    batch, rows = 6, beams + 1 if keep_greedy else beams
    search = beam_search if beams > 1 else greedy_search
    settings = toy(beam_size=beams, keep_greedy=keep_greedy)
    context = {"table": tf.range(batch)}
    # Eager, so that every step's rows are counted; then in a graph, as the export runs it (traced
    # once per setting, each seed's tables and limits its inputs).
    in_graph = {drop_finished: graph_function(lambda cache, tables, max_lengths, drop_finished=drop_finished: search(
        sentence_tables_step(tables, rows), cache, max_lengths, settings, context=context,
        drop_finished=drop_finished), reduce_retracing=True) for drop_finished in (True, False)}
    rows_computed = {True: 0, False: 0}
    for seed in range(6):
        rng = np.random.default_rng(seed)
        vocab = int(rng.integers(6, 12))
        tables = rng.dirichlet(np.full(vocab, 0.3), size=(batch, vocab, vocab)).astype(np.float32)
        max_lengths = rng.integers(1, 14, batch).tolist()
        cache = {"previous": tf.repeat(tf.constant(rng.integers(0, vocab, batch), tf.int32), rows)}
        found = {}
        for drop_finished in (True, False):
            rows_seen = []
            found[drop_finished] = search(sentence_tables_step(tables, rows, rows_seen), cache, max_lengths, settings,
                                          context=context, drop_finished=drop_finished)
            rows_computed[drop_finished] += sum(rows_seen)
            in_graph_found = in_graph[drop_finished](cache, tables, tf.constant(max_lengths))
            np.testing.assert_array_equal(in_graph_found[0].numpy(), found[drop_finished][0].numpy())
            np.testing.assert_allclose(in_graph_found[1].numpy(), found[drop_finished][1].numpy(), rtol=1e-6)
        np.testing.assert_array_equal(found[True][0].numpy(), found[False][0].numpy())
        np.testing.assert_allclose(found[True][1].numpy(), found[False][1].numpy(), rtol=1e-6)
    assert rows_computed[True] < 0.8 * rows_computed[False], rows_computed


@pytest.mark.parametrize("max_lengths", [[], [1, 1, 1], [0, 1, 3]])
def test_an_empty_batch_or_one_that_finishes_at_once_leaves_cleanly(max_lengths):
    batch, vocab = len(max_lengths), 6
    tables = np.random.default_rng(0).dirichlet(np.full(vocab, 0.3), size=(max(batch, 1), vocab, vocab))
    for beams in (1, 2):
        rows = beams + 1 if beams > 1 else 1  # beam search with its greedy row
        cache = {"previous": tf.zeros([batch * rows], tf.int32)}
        context = {"table": tf.range(batch)}
        search = beam_search if beams > 1 else greedy_search
        settings = toy(beam_size=beams, keep_greedy=True)
        found = [graph_function(lambda cache, drop_finished=drop_finished: search(
            sentence_tables_step(tables, rows), cache, max_lengths, settings, context=context,
            drop_finished=drop_finished))(cache) for drop_finished in (True, False)]
        assert found[0][0].shape[0] == batch
        np.testing.assert_array_equal(found[0][0].numpy(), found[1][0].numpy())
        np.testing.assert_allclose(found[0][1].numpy(), found[1][1].numpy(), rtol=1e-6)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_searches_compile_with_xla_on_a_cache_with_all_its_room(model, beam_size):
    # XLA needs fixed shapes: static_shapes=True (all the cache's room at once, finished sentences
    # kept in the batch), and the same translations.
    ids = sources(5)
    settings = decoding(beam_size=beam_size, max_extra_length=20)
    plain = graph_function(lambda x: transformer_search(model, x, settings))(ids)
    compiled = graph_function(lambda x: transformer_search(model, x, settings, static_shapes=True), jit_compile=True)(ids)
    assert (plain[0].numpy() != 0).sum(axis=1).max() > runtime_decoding.INITIAL_CACHE_ROOM  # the plain one's cache grew
    np.testing.assert_array_equal(compiled[0].numpy(), plain[0].numpy())
    np.testing.assert_allclose(compiled[1].numpy(), plain[1].numpy(), atol=1e-5)


def never_beaten(monkeypatch):
    """Switch the early stop off: a sentence ends only with beam_size final hypotheses (or at its limit)."""
    from keras_transformer.inference import search

    monkeypatch.setattr(search, "_cannot_be_beaten", lambda best_final, *args: tf.zeros_like(best_final, tf.bool))


@pytest.mark.parametrize("length_alpha", [0.0, 0.6, 1.0, 2.0])
def test_stopping_once_the_best_cannot_be_beaten_returns_the_same_in_fewer_steps(length_alpha, monkeypatch):
    # Random trigram tables: the early stop must return the very tokens and scores
    # of running until every sentence has beam_size final hypotheses.
    steps = {True: 0, False: 0}
    for seed in range(6):
        rng = np.random.default_rng(seed)
        vocab = int(rng.integers(6, 12))
        table = rng.dirichlet(np.full(vocab, 0.3), size=(vocab, vocab)).astype(np.float32)
        first = rng.integers(0, vocab, 4).tolist()
        max_lengths = rng.integers(6, 16, 4).tolist()
        for beams in (2, 4):
            found = {}
            for early_stop in (True, False):
                counted = toy_step(table)
                if not early_stop:
                    never_beaten(monkeypatch)

                def step_fn(tokens, cache, index, context, counted=counted, early_stop=early_stop):
                    steps[early_stop] += 1
                    return counted(tokens, cache, index, context)

                found[early_stop] = beam_search(  # eager: the loop runs in Python, each step counted
                    step_fn, toy_cache(first, beams), max_lengths, toy(beam_size=beams, length_alpha=length_alpha))
                monkeypatch.undo()
            np.testing.assert_array_equal(found[True][0].numpy(), found[False][0].numpy())
            np.testing.assert_allclose(found[True][1].numpy(), found[False][1].numpy(), rtol=1e-6)
    # A strong length reward (alpha 2) keeps long hypotheses hopeful: no earlier stop to prove.
    assert steps[True] < steps[False] if length_alpha <= 1 else steps[True] <= steps[False], steps


def test_a_checkpoints_token_rules_forbid_force_and_renormalize():
    """`TokenRules`: Hugging Face's bad words, forced first token, forced [END] at the limit, renormalisation."""
    # Ids: 0 padding, 1 start, 2 a word, 3 [END]; padding has the highest logit.
    logits = tf.constant([3.0, 1.0, 0.0, 2.0])

    def step_fn(tokens, cache, index, context):
        return tf.tile(logits[None], [tf.shape(tokens)[0], 1]), cache

    def search(rules, max_length=3):
        settings = DecodingSettings(beam_size=1, length_penalty=LengthPenalty(0.0, offset=0), token_rules=rules)
        tokens, scores = greedy_search(step_fn, tf.zeros([1]), tf.constant([max_length]), settings.for_output(1, 3))
        return [int(t) for t in tokens.numpy()[0] if t], float(scores.numpy()[0])

    log_softmax = lambda values: values - np.log(np.sum(np.exp(values)))  # noqa: E731
    plain = TokenRules(never=(0, 1))
    assert search(plain) == ([3], pytest.approx(log_softmax(np.array([3.0, 1.0, 0.0, 2.0]))[3]))
    # Renormalised: the forbidden ids' share goes to the others.
    assert search(dataclasses.replace(plain, renormalize=True)) == ([3], pytest.approx(log_softmax(np.array([0.0, 2.0]))[1]))
    # A forced first token costs nothing; then the search goes on as before.
    forced = search(dataclasses.replace(plain, forced_first=2))
    assert forced == ([2, 3], pytest.approx(log_softmax(np.array([3.0, 1.0, 0.0, 2.0]))[3]))
    # [END] forced at the last allowed position, where the word would have come.
    prefers_word = dataclasses.replace(plain, never=(0, 1, 3))
    assert search(prefers_word, max_length=2) == ([2, 2], pytest.approx(2 * log_softmax(np.array([3.0, 1.0, 0.0, 2.0]))[2]))
    assert search(dataclasses.replace(prefers_word, end_at_limit=True), max_length=2)[0] == [2, 3]


def test_a_run_imported_before_the_settings_had_names_decodes_as_it_did():
    # Runs imported before DecodingSettings recorded Hugging Face's length penalty and stopping rule
    # by kind; the settings read from them are those the checkpoint imports to now.
    old_section = {"beam_size": 4, "length_alpha": 1.0, "max_extra_length": 512, "max_output_length": 511,
                   "batch_size": 64, "length_penalty_kind": "hf", "stop_when_beam_full": False, "keep_greedy": False,
                   "token_rules": {"never": [0, 7], "forced_first": None, "end_at_limit": True, "renormalize": False}}
    settings = DecodingSettings.from_config(old_section)
    assert settings == DecodingSettings(
        beam_size=4, length_penalty=LengthPenalty(1.0, offset=0), stop_rule="best_live_is_behind", keep_greedy=False,
        max_extra_length=512, max_output_length=511, token_rules=TokenRules(never=(0, 7), end_at_limit=True))
    assert DecodingSettings.from_config(settings.to_config()) == settings
    # Our own runs' sections: the paper's penalty (GNMT's, offset 5), the greedy path beside the beams.
    ours = DecodingSettings.from_config({"beam_size": 4, "length_alpha": 0.6, "max_extra_length": 50})
    assert ours == DecodingSettings()
    assert ours.for_output(START, END).token_rules == TokenRules.ours(START, END)
