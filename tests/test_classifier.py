"""The encoder-only classifier: logits, pooled embeddings, padding, save/reload."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_transformer as kt

CONFIG = dict(vocab_size=30, num_classes=3, num_layers=2, d_model=16, num_heads=4, d_ff=32, max_length=20, dropout=0.0)


def batch():
    token_ids = np.random.default_rng(0).integers(2, 30, size=(4, 8)).astype("int32")
    token_ids[:, 0] = 1  # [CLS]
    token_ids[1, 5:] = 0
    return token_ids


@pytest.mark.parametrize("pooling", ["cls", "mean", "attention"])
def test_logits_and_embedding(pooling):
    model = kt.models.TransformerClassifier(**CONFIG, pooling=pooling)
    token_ids = batch()
    logits = model(token_ids)
    assert tuple(logits.shape) == (4, 3) and keras.backend.standardize_dtype(logits.dtype) == "float32"
    embedded = model.embed(token_ids)
    assert tuple(embedded.shape) == (4, 16)
    # The head sees exactly the pooled embedding.
    np.testing.assert_allclose(model.classifier(embedded), logits, atol=1e-5)


@pytest.mark.parametrize("pooling", ["cls", "mean", "attention"])
def test_padding_does_not_change_predictions(pooling):
    model = kt.models.TransformerClassifier(**CONFIG, pooling=pooling)
    token_ids = batch()
    padded = np.pad(token_ids, ((0, 0), (0, 5)))
    np.testing.assert_allclose(model(padded), model(token_ids), atol=1e-5)


def test_cls_pooling_is_the_first_position():
    model = kt.models.TransformerClassifier(**CONFIG)
    token_ids = batch()
    np.testing.assert_allclose(model.embed(token_ids), model.encoder(token_ids)[:, 0], atol=1e-6)


def test_attention_pooling_weights_sum_to_one_over_real_tokens_and_give_the_pooled_vector():
    model = kt.models.TransformerClassifier(**CONFIG, pooling="attention")
    token_ids = batch()
    weights = ops.convert_to_numpy(model.token_weights(token_ids))
    assert weights.shape == (4, 8)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-6)
    assert np.all(weights[1, 5:] == 0.0) and np.all(weights[1, :5] > 0)
    # The pooled vector is exactly the weighted sum of the encoder's states.
    states = ops.convert_to_numpy(model.encoder(token_ids))
    np.testing.assert_allclose(model.embed(token_ids), np.einsum("bl,bld->bd", weights, states), atol=1e-5)
    with pytest.raises(ValueError, match="token weights need pooling='attention'"):
        kt.models.TransformerClassifier(**CONFIG).token_weights(token_ids)


@pytest.mark.trains
def test_attention_pooling_learns_to_weigh_the_deciding_token():
    """Class = whether token 5 occurs: the pooling's weight should go to token 5."""
    rng = np.random.default_rng(2)
    token_ids = rng.integers(6, 30, size=(2000, 10)).astype("int32")
    labels = rng.integers(0, 2, size=2000)
    positions = rng.integers(1, 10, size=2000)
    token_ids[labels == 1, positions[labels == 1]] = 5
    token_ids[:, 0] = 1
    model = kt.models.TransformerClassifier(**{**CONFIG, "num_classes": 2, "num_layers": 1}, pooling="attention")
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    history = model.fit(token_ids, labels, batch_size=64, epochs=4, verbose=0)
    assert history.history["accuracy"][-1] > 0.95
    positives = token_ids[labels == 1][:200]
    weights = ops.convert_to_numpy(model.token_weights(positives))
    weight_on_token_5 = weights[positives == 5]
    # Ten tokens share the weight: uniform would give 0.1 each.
    assert np.median(weight_on_token_5) > 0.3, np.median(weight_on_token_5)


@pytest.mark.parametrize("pooling", ["mean", "attention"])
def test_save_and_reload(tmp_path, pooling):
    model = kt.models.TransformerClassifier(**{**CONFIG, "dropout": 0.1, "pooling": pooling, "position": "learned"})
    token_ids = batch()
    logits = model(token_ids)
    model.save(tmp_path / "classifier.keras")
    reloaded = keras.saving.load_model(tmp_path / "classifier.keras")
    np.testing.assert_array_equal(ops.convert_to_numpy(reloaded(token_ids)), ops.convert_to_numpy(logits))
    assert reloaded.get_config() == model.get_config()


@pytest.mark.trains
def test_learns_a_simple_rule():
    """Class = whether token 5 occurs: one attention hop from [CLS]."""
    rng = np.random.default_rng(1)
    token_ids = rng.integers(6, 30, size=(2000, 10)).astype("int32")
    labels = rng.integers(0, 2, size=2000)
    positions = rng.integers(1, 10, size=2000)
    token_ids[labels == 1, positions[labels == 1]] = 5
    token_ids[:, 0] = 1
    model = kt.models.TransformerClassifier(**{**CONFIG, "num_classes": 2})
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    history = model.fit(token_ids, labels, batch_size=64, epochs=4, verbose=0)
    assert history.history["accuracy"][-1] > 0.95


@pytest.mark.parametrize(
    "bad, message",
    [(dict(pooling="max"), "pooling must be one of"), (dict(num_classes=0), "num_classes must be a positive integer")],
)
def test_bad_arguments(bad, message):
    with pytest.raises(ValueError, match=message):
        kt.models.TransformerClassifier(**{**CONFIG, **bad})
