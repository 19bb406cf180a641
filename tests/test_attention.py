"""Scaled dot-product and multi-head attention: the numbers, the masks, the cache."""

import pathlib

import keras
import numpy as np
import pytest
from keras import ops

import keras_transformer as kt
from gradients import gradients


def reference_attention(queries, keys, values, mask=None):
    """Equation (1) in NumPy, float64."""
    logits = queries @ np.swapaxes(keys, -1, -2) / np.sqrt(queries.shape[-1])
    if mask is not None:
        logits = np.where(mask, logits, -np.inf)
    logits = logits - logits.max(axis=-1, keepdims=True)
    weights = np.exp(logits)
    weights = weights / weights.sum(axis=-1, keepdims=True)
    return weights @ values, weights


def random(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


class TestScaledDotProductAttention:
    def test_matches_the_equation(self):
        queries, keys, values = random(2, 3, 5, 8, seed=1), random(2, 3, 7, 8, seed=2), random(2, 3, 7, 4, seed=3)
        outputs, weights = kt.layers.scaled_dot_product_attention(queries, keys, values)
        expected_outputs, expected_weights = reference_attention(queries, keys, values)
        np.testing.assert_allclose(weights, expected_weights, atol=1e-6)
        np.testing.assert_allclose(outputs, expected_outputs, atol=1e-5)
        assert outputs.shape == (2, 3, 5, 4) and weights.shape == (2, 3, 5, 7)

    def test_masked_keys_get_exactly_zero_weight(self):
        queries, keys, values = random(2, 4, 8, seed=1), random(2, 6, 8, seed=2), random(2, 6, 8, seed=3)
        mask = np.ones((2, 4, 6), bool)
        mask[:, :, 4:] = False
        outputs, weights = kt.layers.scaled_dot_product_attention(queries, keys, values, mask=mask)
        assert np.all(ops.convert_to_numpy(weights)[:, :, 4:] == 0.0)
        np.testing.assert_allclose(ops.sum(weights, axis=-1), 1.0, atol=1e-6)
        expected, _ = reference_attention(queries, keys, values, mask)
        np.testing.assert_allclose(outputs, expected, atol=1e-5)

    def test_fully_masked_row_is_zero_not_nan(self):
        queries, keys, values = random(1, 3, 4), random(1, 5, 4), random(1, 5, 4)
        mask = np.ones((1, 3, 5), bool)
        mask[0, 1, :] = False
        outputs, weights = kt.layers.scaled_dot_product_attention(queries, keys, values, mask=mask)
        outputs, weights = ops.convert_to_numpy(outputs), ops.convert_to_numpy(weights)
        assert np.all(np.isfinite(outputs)) and np.all(np.isfinite(weights))
        assert np.all(weights[0, 1] == 0) and np.all(outputs[0, 1] == 0)

    @pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
    def test_half_precision_masking_is_safe(self, dtype):
        # Large logits in half precision: the masked value must not overflow,
        # and masked keys must still get zero weight.
        queries = ops.cast(random(2, 4, 16, seed=4) * 8, dtype)
        keys = ops.cast(random(2, 6, 16, seed=5) * 8, dtype)
        values = ops.cast(random(2, 6, 16, seed=6), dtype)
        mask = np.tril(np.ones((4, 6), bool))
        outputs, weights = kt.layers.scaled_dot_product_attention(queries, keys, values, mask=mask)
        assert keras.backend.standardize_dtype(outputs.dtype) == dtype
        weights = ops.convert_to_numpy(ops.cast(weights, "float32"))
        assert np.all(np.isfinite(weights))
        assert np.all(weights[:, ~mask] == 0)


def transfer_weights_to_keras(ours, theirs):
    """Give keras.layers.MultiHeadAttention our projection weights."""
    theirs.query_dense.kernel.assign(ours.query_kernel)
    theirs.key_dense.kernel.assign(ours.key_value_kernel[:, 0])
    theirs.value_dense.kernel.assign(ours.key_value_kernel[:, 1])
    theirs.output_dense.kernel.assign(ours.output_kernel)
    theirs.query_dense.bias.assign(ours.query_bias)
    theirs.key_dense.bias.assign(ours.key_value_bias[0])
    theirs.value_dense.bias.assign(ours.key_value_bias[1])
    theirs.output_dense.bias.assign(ours.output_bias)


class TestMultiHeadAttention:
    def make_pair(self, query, value, num_heads=4):
        ours = kt.layers.MultiHeadAttention(num_heads=num_heads)
        ours(query, value)
        d_model = query.shape[-1]
        theirs = keras.layers.MultiHeadAttention(num_heads=num_heads, key_dim=d_model // num_heads)
        theirs(query, value)
        # Random biases too, so a bias mix-up cannot hide behind zeros.
        for weight in ours.weights:
            weight.assign(random(*weight.shape, seed=len(weight.path)) * 0.2)
        transfer_weights_to_keras(ours, theirs)
        return ours, theirs

    def test_self_attention_matches_keras(self):
        x = random(2, 7, 32)
        ours, theirs = self.make_pair(x, x)
        for causal in (False, True):
            expected = theirs(x, x, use_causal_mask=causal)
            np.testing.assert_allclose(ours(x, x, use_causal_mask=causal), expected, atol=1e-5)
            # Omitting value means self-attention too.
            np.testing.assert_allclose(ours(x, use_causal_mask=causal), expected, atol=1e-5)

    def test_cross_attention_with_padding_matches_keras(self):
        query, value = random(2, 5, 32, seed=1), random(2, 9, 16, seed=2)
        ours, theirs = self.make_pair(query, value)
        value_mask = np.ones((2, 9), bool)
        value_mask[1, 6:] = False
        expected, expected_scores = theirs(query, value, value_mask=value_mask, return_attention_scores=True)
        outputs, scores = ours(query, value, value_mask=value_mask, return_attention_scores=True)
        np.testing.assert_allclose(outputs, expected, atol=1e-5)
        np.testing.assert_allclose(scores, expected_scores, atol=1e-6)

    def test_keras_masks_are_honoured(self):
        # Padded keys come from an Embedding with mask_zero: they must get zero
        # weight, so changing what sits at those positions changes nothing.
        embed = keras.layers.Embedding(50, 16, mask_zero=True)
        attention = kt.layers.MultiHeadAttention(num_heads=2)
        ids = np.array([[3, 4, 5, 0, 0], [6, 7, 8, 9, 0]])
        query = random(2, 3, 16, seed=7)
        outputs, scores = attention(query, embed(ids), return_attention_scores=True)
        scores = ops.convert_to_numpy(scores)
        assert np.all(scores[0, :, :, 3:] == 0) and np.all(scores[1, :, :, 4:] == 0)
        embedded = embed(ids)
        replaced = ops.where(ops.expand_dims(ids == 0, -1), 100.0, embedded)
        replaced._keras_mask = embedded._keras_mask
        np.testing.assert_allclose(attention(query, replaced), outputs, atol=1e-6)

    def test_indivisible_d_model_names_both_numbers(self):
        with pytest.raises(ValueError, match=r"d_model=30.*num_heads=4"):
            kt.layers.MultiHeadAttention(num_heads=4)(random(1, 3, 30))

    @pytest.mark.parametrize("bad", [dict(num_heads=0), dict(num_heads=2, key_dim=-1), dict(num_heads=2, dropout=1.5)])
    def test_bad_arguments(self, bad):
        with pytest.raises(ValueError):
            kt.layers.MultiHeadAttention(**bad)

    def test_sliding_window_hides_distant_keys(self):
        x = random(1, 10, 16)
        for causal in (False, True):
            attention = kt.layers.MultiHeadAttention(num_heads=2, sliding_window=2)
            _, scores = attention(x, x, use_causal_mask=causal, return_attention_scores=True)
            scores = ops.convert_to_numpy(scores)[0]
            distance = np.arange(10)[:, None] - np.arange(10)[None, :]
            visible = (distance >= 0) & (distance <= 2) if causal else np.abs(distance) <= 2
            assert np.all(scores[:, ~visible] == 0)
            assert np.all(scores[:, visible] > 0)

    def test_cached_steps_match_full_causal_attention(self):
        x = random(2, 6, 16)
        attention = kt.layers.CachedMultiHeadAttention(num_heads=4, sliding_window=3)
        full = attention(x, use_causal_mask=True)
        cache = attention.empty_cache(2, max_length=8)
        steps = []
        for t in range(6):
            output, cache = attention(x[:, t : t + 1], use_causal_mask=True, cache=cache, cache_index=t)
            steps.append(output)
        np.testing.assert_allclose(ops.concatenate(steps, axis=1), full, atol=1e-5)
        # The cache holds every position's keys; unfilled slots stay zero.
        assert np.all(ops.convert_to_numpy(cache)[:, :, :, 6:] == 0)

    def test_static_cache_matches_cross_attention(self):
        query, value = random(2, 4, 16, seed=1), random(2, 5, 16, seed=2)
        value_mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
        attention = kt.layers.CachedMultiHeadAttention(num_heads=4)
        expected = attention(query, value, value_mask=value_mask)
        cache = attention.compute_cache(value)
        outputs, same_cache = attention(query, value_mask=value_mask, cache=cache)
        np.testing.assert_allclose(outputs, expected, atol=1e-6)
        assert all(returned is given for returned, given in zip(same_cache, cache))  # read, never written


class TestFusedAttention:
    """The backend's fused kernel gives what the explicit path gives, wherever it is used."""

    PADDING = np.array([[1] * 7, [1] * 4 + [0] * 3, [1] + [0] * 6], bool)

    @staticmethod
    def both_paths(attention, call):
        """`call()` with the explicit path, then with the fused one."""
        results = []
        for fused in (False, True):
            attention.fused_attention = fused
            results.append(keras.tree.map_structure(ops.convert_to_numpy, call()))
        return results

    @pytest.mark.parametrize("sliding_window", [None, 2])
    @pytest.mark.parametrize("causal", [False, True])
    def test_self_attention_with_padding(self, causal, sliding_window):
        inputs = random(3, 7, 16, seed=10)
        attention = kt.layers.MultiHeadAttention(num_heads=4, sliding_window=sliding_window)
        explicit, fused = self.both_paths(attention, lambda: attention(
            inputs, query_mask=self.PADDING, value_mask=self.PADDING, use_causal_mask=causal))
        np.testing.assert_allclose(fused, explicit, atol=1e-5)
        assert np.all(fused[~self.PADDING] == 0)  # padded queries mix in nothing, on both paths

    def test_cross_attention_and_its_static_cache(self):
        query, value = random(3, 5, 16, seed=11), random(3, 7, 16, seed=12)
        attention = kt.layers.CachedMultiHeadAttention(num_heads=4)
        explicit, fused = self.both_paths(attention, lambda: attention(query, value, value_mask=self.PADDING))
        np.testing.assert_allclose(fused, explicit, atol=1e-5)
        cache = attention.compute_cache(value)
        explicit, fused = self.both_paths(attention, lambda: attention(query[:, :1], value_mask=self.PADDING, cache=cache)[0])
        np.testing.assert_allclose(fused, explicit, atol=1e-5)

    def test_decoding_steps_on_the_cache(self):
        inputs = random(2, 6, 16, seed=13)
        attention = kt.layers.CachedMultiHeadAttention(num_heads=4)
        attention(inputs)

        def decode():
            cache, steps = attention.empty_cache(2, 6), []
            for position in range(6):
                step, cache = attention(inputs[:, position : position + 1], use_causal_mask=True, cache=cache,
                                        cache_index=position)
                steps.append(step)
            return ops.concatenate(steps, axis=1)

        explicit, fused = self.both_paths(attention, decode)
        np.testing.assert_allclose(fused, explicit, atol=1e-5)

    def test_gradients_are_the_same(self):
        inputs = random(3, 7, 16, seed=14)
        attention = kt.layers.MultiHeadAttention(num_heads=4)
        attention(inputs)
        loss = lambda: ops.sum(ops.square(attention(inputs, query_mask=self.PADDING, value_mask=self.PADDING,
                                                    use_causal_mask=True)))
        explicit, fused = self.both_paths(attention, lambda: gradients(loss, attention.trainable_variables))
        for name, a, b in zip([v.path for v in attention.trainable_variables], explicit, fused):
            assert np.all(np.isfinite(b)), name
            np.testing.assert_allclose(b, a, atol=1e-4, err_msg=name)

    def test_the_weights_still_come_from_the_explicit_path(self):
        inputs = random(2, 5, 16, seed=15)
        attention = kt.layers.MultiHeadAttention(num_heads=2)
        attention.fused_attention = True
        outputs, weights = attention(inputs, use_causal_mask=True, return_attention_scores=True)
        assert tuple(weights.shape) == (2, 2, 5, 5)
        np.testing.assert_allclose(ops.convert_to_numpy(ops.sum(weights, axis=-1)), 1.0, atol=1e-6)
        np.testing.assert_allclose(outputs, attention(inputs, use_causal_mask=True), atol=1e-5)

    def test_the_default_is_fused_on_jax_and_pytorch_only(self, monkeypatch):
        from keras_transformer.layers import attention as attention_module

        calls = []
        kernel = attention_module.fused_dot_product_attention
        monkeypatch.setattr(attention_module, "fused_dot_product_attention",
                            lambda *args, **kwargs: calls.append(1) or kernel(*args, **kwargs))

        def fused(layer, *inputs, **options):  # whether this call went through the fused kernel
            calls.clear()
            layer(*inputs, **options)
            return bool(calls)

        query, value = random(2, 5, 16, seed=16), random(2, 7, 16, seed=17)
        attention = kt.layers.MultiHeadAttention(num_heads=2)
        assert fused(attention, query) is (keras.backend.backend() in ("jax", "torch"))
        # Weights asked for, dropout on the weights, predicted windows: always explicit.
        attention.fused_attention = True
        assert fused(attention, query) and not fused(attention, query, return_attention_scores=True)
        dropping = kt.layers.MultiHeadAttention(num_heads=2, dropout=0.1)
        dropping.fused_attention = True
        assert not fused(dropping, query, training=True) and fused(dropping, query, training=False)
        predicting = kt.layers.PredictiveLocalAttention(num_heads=2, sliding_window=2)
        predicting.fused_attention = True
        assert not fused(predicting, query, value)


class TestPredictiveLocalAttention:
    """Luong et al.'s local-p: a window of +-D around a predicted p_t, Gaussian-weighted."""

    WINDOW = 2

    def attention(self, num_heads=2):
        from keras_transformer.layers.cached_attention import CachedPredictiveLocalAttention

        return CachedPredictiveLocalAttention(num_heads=num_heads, sliding_window=self.WINDOW)

    def test_weights_outside_the_predicted_window_are_exactly_zero(self):
        query, value = random(2, 5, 16, seed=3), random(2, 12, 16, seed=4)
        value_mask = np.ones((2, 12), bool)
        value_mask[0, 8:] = False  # S = 8 for the first sentence, 12 for the second
        attention = self.attention()
        _, weights = attention(query, value, value_mask=value_mask, return_attention_scores=True)
        weights = ops.convert_to_numpy(weights)
        positions = ops.convert_to_numpy(attention.aligned_positions(query, value_mask, 12))
        assert positions.shape == (2, 2, 5)
        assert np.all(positions[0] <= 8) and np.all(positions[1] <= 12) and np.all(positions >= 0)
        distance = np.abs(np.arange(12)[None, None, None, :] - positions[..., None])
        assert np.all(weights[distance > self.WINDOW] == 0)
        assert np.all(weights[0, :, :, 8:] == 0)  # padded keys too
        inside = (distance <= self.WINDOW) & value_mask[:, None, None, :]
        assert np.all(weights[inside] > 0)

    def test_weights_are_the_softmax_times_the_gaussian(self):
        # Equal keys: the softmax is uniform over the window, so the weights are the Gaussian's shape.
        query, value = random(1, 4, 16, seed=5), np.ones((1, 20, 16), "float32")
        attention = self.attention(num_heads=1)
        _, weights = attention(query, value, return_attention_scores=True)
        weights = ops.convert_to_numpy(weights)[0, 0]
        positions = ops.convert_to_numpy(attention.aligned_positions(query, None, 20))[0, 0]
        sigma = self.WINDOW / 2
        for row, position in zip(weights, positions):
            keys = np.arange(20)
            inside = np.abs(keys - position) <= self.WINDOW
            expected = np.exp(-((keys - position) ** 2) / (2 * sigma**2)) / inside.sum()
            np.testing.assert_allclose(row[inside], expected[inside], rtol=1e-5)

    def test_gradients_reach_the_alignment_weights(self):
        query, value = random(2, 5, 16, seed=6), random(2, 9, 16, seed=7)
        attention = self.attention()
        attention(query, value)
        kernel, vector = gradients(
            lambda: ops.sum(ops.square(attention(query, value))),
            [attention.alignment_kernel, attention.alignment_vector],
        )
        assert float(ops.max(ops.abs(kernel))) > 0 and float(ops.max(ops.abs(vector))) > 0

    def test_the_static_cache_gives_the_full_pass(self):
        query, value = random(2, 4, 16, seed=8), random(2, 7, 16, seed=9)
        value_mask = np.array([[1] * 5 + [0] * 2, [1] * 7], bool)
        attention = self.attention()
        expected = attention(query, value, value_mask=value_mask)
        cache = attention.compute_cache(value)
        steps = [attention(query[:, t : t + 1], value_mask=value_mask, cache=cache)[0] for t in range(4)]
        np.testing.assert_allclose(ops.concatenate(steps, axis=1), expected, atol=1e-6)

    def test_predictive_needs_a_window_and_alignments_are_named(self):
        with pytest.raises(ValueError, match="needs sliding_window"):
            kt.layers.AttentionSublayer(num_heads=2, window_alignment="predictive")
        with pytest.raises(ValueError, match="window_alignment must be one of"):
            kt.layers.AttentionSublayer(num_heads=2, sliding_window=2, window_alignment="gaussian")
        with pytest.raises(ValueError, match="sliding_window must be a positive integer"):
            kt.layers.PredictiveLocalAttention(num_heads=2, sliding_window=0)
        token, attention = random(1, 1, 16), self.attention()
        attention(token)
        with pytest.raises(ValueError, match="not a decoding cache"):
            attention(token, cache=attention.empty_cache(1, 4), cache_index=0)


def test_attention_layers_saved_with_a_window_alignment_load_and_compute_as_saved(tmp_path):
    # Saved by the code before predictive local attention became its own class (adb703a,
    # `tests/fixtures/legacy/`): its config names `window_alignment`, its weights are the same.
    legacy = pathlib.Path(__file__).parent / "fixtures" / "legacy"
    saved = np.load(legacy / "attention.npz")
    model = keras.saving.load_model(legacy / "attention.keras")
    # Saved again, the file loads as the one it came from.
    model.save(tmp_path / "again.keras")
    for model in (model, keras.saving.load_model(tmp_path / "again.keras")):
        assert isinstance(model.get_layer("predictive"), kt.layers.PredictiveLocalAttention)
        assert type(model.get_layer("monotonic")) is kt.layers.MultiHeadAttention
        predictive, monotonic = model([saved["query"], saved["value"]])
        np.testing.assert_allclose(ops.convert_to_numpy(predictive), saved["predictive"], atol=1e-6)
        np.testing.assert_allclose(ops.convert_to_numpy(monotonic), saved["monotonic"], atol=1e-6)
    # A decoder's attention saved on its own as predictive is refused in one line (its model loads).
    config = {**model.get_layer("predictive").get_config(), "window_alignment": "predictive"}
    with pytest.raises(ValueError, match="a CachedMultiHeadAttention saved with window_alignment='predictive'"):
        kt.layers.CachedMultiHeadAttention.from_config(config)
