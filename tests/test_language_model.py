"""The decoder alone (`LanguageModel`) and sampling from it."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.inference import (
    SamplingSettings,
    filter_logits,
    language_model_prefill,
    language_model_step,
    sample,
)

pytestmark = pytest.mark.tensorflow  # the sampler is TensorFlow ops (tf.while_loop), as the searches

VOCAB, END = 40, 3
SIZES = dict(vocab_size=VOCAB, num_layers=2, d_model=32, num_heads=4, d_ff=64, max_length=32, dropout=0.0)


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(1)
    model = kt.models.LanguageModel(**SIZES)
    model.build((None, None))
    return model


def test_a_token_sees_only_the_tokens_before_it(model):
    tokens = np.random.default_rng(0).integers(4, VOCAB, (2, 10)).astype("int32")
    changed = tokens.copy()
    changed[:, 6:] = np.random.default_rng(1).integers(4, VOCAB, (2, 4))
    np.testing.assert_allclose(model(changed)[:, :6], model(tokens)[:, :6], atol=1e-5)
    logits, scores = model(tokens, return_attention_scores=True)
    weights = keras.ops.convert_to_numpy(scores["decoder/layer_1/self_attention"])  # (batch, heads, 10, 10)
    assert weights.shape == (2, 4, 10, 10) and np.all(weights[..., np.triu_indices(10, 1)[0], np.triu_indices(10, 1)[1]] == 0)


def test_reload_is_exact_and_gpt2_small_has_its_size(tmp_path, model):
    tokens = np.arange(4, 14, dtype="int32")[None]
    path = tmp_path / "lm.keras"
    model.save(path)
    np.testing.assert_array_equal(keras.models.load_model(path)(tokens), model(tokens))
    gpt2 = kt.models.LanguageModel.from_preset("gpt2-small", vocab_size=50257)
    gpt2.build((None, None))
    assert 124_000_000 < gpt2.count_params() < 125_000_000  # GPT-2's 124M (plus an output bias)
    with pytest.raises(ValueError, match="needs vocab_size"):
        kt.models.LanguageModel.from_preset("small")


def prompts_of(rows):
    """Right-padded prompts and their lengths."""
    width = max(len(row) for row in rows)
    return (np.array([row + [0] * (width - len(row)) for row in rows], "int32"),
            np.array([len(row) for row in rows], "int32"))


def run(model, rows, use_cache=True, **settings):
    prompts, lengths = prompts_of(rows)
    settings = SamplingSettings(**{"max_new_tokens": 8, **settings})
    step_fn, cache = language_model_step(model, len(rows), prompts.shape[1] + settings.max_new_tokens,
                                         use_cache=use_cache)
    # The cached run reads the prompts' shared positions in one pass; the reference, one position a step.
    tokens, text_lengths = sample(step_fn, cache, prompts, lengths, END, settings, never=(0, 1, 2),
                                  prefill_fn=language_model_prefill(model) if use_cache else None)
    return [list(row[:length]) for row, length in zip(tokens.numpy(), text_lengths.numpy())]


ROWS = [[2, 5, 9, 11], [2, 7], [2, 30, 12, 8, 4, 22]]


def test_the_same_seed_gives_the_same_texts_and_another_seed_others(model):
    first = run(model, ROWS, seed=7, temperature=1.5)
    assert first == run(model, ROWS, seed=7, temperature=1.5)
    assert first != run(model, ROWS, seed=8, temperature=1.5)
    for row, text in zip(ROWS, first):
        assert text[: len(row)] == row and len(row) < len(text) <= len(row) + 8
        assert all(token not in (0, 1, 2) for token in text[len(row):])


def test_sampling_on_the_cache_equals_sampling_with_the_whole_prefix_recomputed(model):
    # Prompts sharing 1 and 3 positions: those are read in one pass on the cache.
    longer = [[2, 5, 9, 11, 13], [2, 7, 8, 9], [2, 30, 12, 8, 4, 22]]
    for rows in (ROWS, longer):
        for settings in (dict(temperature=0), dict(seed=3, top_k=5), dict(seed=4, top_p=0.8, temperature=0.7)):
            assert run(model, rows, **settings) == run(model, rows, use_cache=False, **settings)


def test_a_prefilled_cache_gives_the_logits_of_the_whole_prefix(model):
    # Logits, not sampled tokens: an untrained model mostly repeats its last token,
    # whatever came before, so only the numbers show a cache that holds the wrong prefix.
    tokens = np.random.default_rng(2).integers(4, VOCAB, (2, 9)).astype("int32")
    step_fn, cache = language_model_step(model, 2, 12)
    cache = language_model_prefill(model)(tokens[:, :6], cache)
    for position in range(6, 9):
        logits, cache = step_fn(tokens[:, position], cache, position, ())
        np.testing.assert_allclose(logits, model(tokens[:, : position + 1])[:, -1], atol=1e-4)


def test_prompts_of_different_lengths_continue_as_each_would_alone(model):
    # Sampled too: a prompt's draws depend on the seed and the position, not on its row or its neighbours.
    for settings in (dict(temperature=0), dict(seed=3, temperature=1.5), dict(seed=4, top_k=6)):
        together = run(model, ROWS, **settings)
        alone = [run(model, [row], **settings)[0] for row in ROWS]
        assert together == alone, settings
        assert run(model, ROWS[::-1], **settings) == together[::-1], settings


def test_draws_follow_the_softmax_of_the_filtered_logits():
    # One text of 4,000 draws from the same logits (each position its own noise): the frequencies are
    # the probabilities. ([END], id 3, has none.)
    draws = 4000
    logits = tf.math.log(tf.constant([[0.5, 0.3, 0.2, 1e-12]]))
    step_fn = lambda tokens, cache, index, context: (logits, cache)  # noqa: E731

    @tf.function
    def text(top_k):
        return sample(step_fn, tf.zeros([1, 1]), tf.fill([1, 1], 2), tf.ones([1], tf.int32), END,
                      SamplingSettings(draws, seed=5, top_k=top_k), never=())[0]

    for top_k, expected in ((None, [0.5, 0.3, 0.2, 0.0]), (2, [0.625, 0.375, 0.0, 0.0])):
        frequencies = np.bincount(text(top_k).numpy()[0, 1:], minlength=4) / draws
        np.testing.assert_allclose(frequencies, expected, atol=0.03)


def test_top_k_1_and_a_tiny_top_p_are_greedy_and_end_stops_a_text():
    logits = tf.constant([[0.0, 3.0, 1.0, 2.0], [5.0, 1.0, 4.0, 0.0]])
    np.testing.assert_array_equal(filter_logits(logits, top_k=2) > -1e8, [[0, 1, 0, 1], [1, 0, 1, 0]])
    np.testing.assert_array_equal(filter_logits(logits, top_p=0.01) > -1e8, [[0, 1, 0, 0], [1, 0, 0, 0]])
    # softmax([3, 2, 1, 0]) = 0.64, 0.24, ...: p = 0.7 keeps the two most probable.
    np.testing.assert_array_equal(filter_logits(logits[:1], top_p=0.7) > -1e8, [[0, 1, 0, 1]])
    np.testing.assert_allclose(filter_logits(logits, temperature=2.0), logits / 2)

    # A model that always prefers [END] after the prompt: texts end at once.
    def step_fn(tokens, cache, index, context):
        return tf.one_hot(tf.fill(tf.shape(tokens), END), VOCAB) * 10.0, cache

    prompts, lengths = prompts_of([[2, 5, 6], [2]])
    tokens, text_lengths = sample(step_fn, tf.zeros([2, 1]), prompts, lengths, END, SamplingSettings(5, top_k=1))
    assert tokens.numpy().tolist() == [[2, 5, 6, END, 0, 0, 0, 0], [2, END, 0, 0, 0, 0, 0, 0]]
    assert text_lengths.numpy().tolist() == [4, 2]


@pytest.mark.slow
def test_train_lm_generate_and_evaluate_on_the_command_line(trained_language_model_run, tmp_path):
    # The commands through their entry function, in this process (the console script is tested in
    # test_cli.py), on the suite's run that `train-lm` made (conftest.py).
    from helpers import cli_here as cli
    from keras_transformer.training import choose_precision

    run, trained = trained_language_model_run
    assert "validation perplexity" in trained
    # The run records what precision "auto" (the default) chose, and why.
    settings = json.loads((run / "config.json").read_text())["training"]
    assert settings["precision"] == "auto"
    assert (settings["precision_chosen"], settings["precision_reason"]) == choose_precision("auto")

    def generate(*settings):
        return cli("generate", run, "The young cat", "A dog", *settings).stdout.splitlines()

    first = generate("--seed", "3", "--top-p", "0.9")
    assert len(first) == 2 and first[0].startswith("The young cat") and first[1].startswith("A dog")
    assert generate("--seed", "3", "--top-p", "0.9") == first
    greedy = generate("--temperature", "0")
    assert greedy == generate("--temperature", "0", "--seed", "9")  # greedy ignores the seed

    evaluated = cli("evaluate", run)
    scores = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert 1 < scores["perplexity"] < 100 and 0 < scores["bits_per_character"] < 5
    held_out = tmp_path / "other.txt"
    held_out.write_text("The big dog sees a cat.\nNow a cow sleeps.\n", encoding="utf-8")
    assert "on 2 texts" in cli("evaluate", run, "--text", held_out).stdout

    refused = cli("generate", run, "A dog", "--top-p", "2", check=False)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1].startswith("keras-transformer: error: ")

    # Each epoch wrote its prompts' self-attention for the Attention tab.
    tags = {value.tag for events in (run / "logs" / "samples").glob("events*")
            for event in tf.compat.v1.train.summary_iterator(str(events)) for value in event.summary.value}
    assert {"attention/sample_0/texts", "attention/sample_0/decoder_self/layer_0"} <= tags, tags
    page, png = tmp_path / "attention.html", tmp_path / "attention.png"
    plotted = cli("plot-attention", run, "A dog", "--html", page, "--out", png, "--seed", "2")
    assert plotted.stdout.startswith("A dog") and png.stat().st_size > 1000
    assert '"kind": "decoder_self"' in page.read_text(encoding="utf-8")
    wrong_kind = cli("plot-attention", run, "A dog", "--html", page, "--kind", "cross", check=False)
    assert wrong_kind.returncode == 2 and "decoder_self only" in wrong_kind.stderr

    exported = cli("export", run, tmp_path / "exports")
    assert f"exported SavedModel: {tmp_path / 'exports' / '1'}" in exported.stdout and "generate (text, seed" in exported.stdout
