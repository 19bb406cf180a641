"""The decoder (Section 3.1, right half of Figure 1).

"In addition to the two sub-layers in each encoder layer, the decoder inserts
a third sub-layer, which performs multi-head attention over the output of the
encoder stack. ... This masking, combined with fact that the output
embeddings are offset by one position, ensures that the predictions for
position i can depend only on the known outputs at positions less than i."

**Incremental decoding.** `Decoder.build_cache` returns one dict per layer,

    {"self_attention":  (2, batch, heads, max_length, key_dim)   zeros,
     "cross_attention": (2, batch, heads, source_length, key_dim)}  (if any)

and `Decoder(new_ids, cache=cache, cache_index=t)` runs only the new
positions t, t+1, ..., returning `(outputs, updated_cache)`. A cross-attention
cache may also be a `(keys, values)` pair, each `(batch, heads,
source_length, key_dim)`: sentences on axis 0, as decoding's context keeps them.

**Beams share their source.** A beam search decodes several rows per
sentence (its beams), which all attend to the same source. With
`rows_per_source=k`, the encoder output or cross-attention cache holds one
row per sentence, and each serves k consecutive rows of the target: for
cross-attention those rows become k query positions of one row. Every query
attends on its own, so the result is the same; the source's keys and values
are stored and read once per sentence, not once per beam.
"""

import keras
from keras import ops

from keras_transformer.layers.checks import check_heads_divide, check_positive_int
from keras_transformer.layers.config import Hyperparameters
from keras_transformer.layers.encoder import EncoderLayer
from keras_transformer.layers.masks import keras_mask, padding_mask
from keras_transformer.layers.stack import TransformerStack
from keras_transformer.layers.sublayers import AttentionSublayer, FeedForwardSublayer


def _positions_as_rows(weights, rows_per_source, length):
    """Cross-attention weights `(sentences, heads, rows_per_source * length, keys)` -> `(rows, heads, length, keys)`."""
    sentences, heads, keys = ops.shape(weights)[0], ops.shape(weights)[1], ops.shape(weights)[3]
    weights = ops.reshape(weights, (sentences, heads, rows_per_source, length, keys))
    weights = ops.transpose(weights, (0, 2, 1, 3, 4))
    return ops.reshape(weights, (sentences * rows_per_source, heads, length, keys))


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderLayer(Hyperparameters, keras.layers.Layer):
    """One decoder layer: causal self-attention, cross-attention, feed-forward.

        x = LayerNorm(x + Dropout(CausalSelfAttention(x)))
        x = LayerNorm(x + Dropout(Attention(queries=x, keys=values=encoder)))
        x = LayerNorm(x + Dropout(FFN(x)))

    With `cross_attention=False` the middle sub-layer is left out: a
    decoder-only (GPT-style) block.

    Args:
        num_heads, d_ff, dropout, norm_first, epsilon: as for `EncoderLayer`.
        cross_attention: include attention over an encoder output.
        sliding_window: self-attention sees only the previous w positions.
        cross_attention_window: D, for local cross-attention: each target
            position predicts the source position it is aligned with and sees
            the 2D+1 source positions around it, Gaussian-weighted (Luong et
            al. 2015's local-p; `MultiHeadAttention`'s "predictive" window).
            None: the whole source, the paper's global attention.
        activation, attention_dropout, activation_dropout: as for `EncoderLayer`.

    Call arguments:
        inputs: `(batch, length, d_model)`.
        encoder_outputs: `(batch, source_length, d_model)` (cross-attention).
        padding_mask: `(batch, length)`, True at real target tokens; taken
            from the Keras mask of `inputs` when not given.
        encoder_padding_mask: `(batch, source_length)`; taken from the Keras
            mask of `encoder_outputs` when not given. Padded source positions
            get exactly zero cross-attention weight.
        training: whether dropout is active.
        return_attention_scores: also return `{"self_attention": ...,
            "cross_attention": ...}`, each `(batch, heads, q_len, k_len)`.
        cache: this layer's cache dict (see the module docstring).
        cache_index: number of positions already in the self-attention cache.
        rows_per_source: how many consecutive rows of `inputs` share each row
            of `encoder_outputs` or of the cross-attention cache (a beam
            search's rows of one sentence; see the module docstring).

    Returns:
        `(batch, length, d_model)`, then the scores dict when asked, then the
        updated cache when given.

    Example:
    >>> layer = DecoderLayer(num_heads=8, d_ff=2048)
    >>> target, source = keras.ops.zeros((2, 9, 512)), keras.ops.zeros((2, 7, 512))
    >>> layer(target, source).shape  # (2, 9, 512)
    """

    hyperparameters = EncoderLayer.hyperparameters + ("cross_attention", "cross_attention_window")

    def __init__(
        self,
        num_heads,
        d_ff,
        dropout=0.1,
        norm_first=False,
        epsilon=1e-6,
        cross_attention=True,
        sliding_window=None,
        activation="relu",
        attention_dropout=0.0,
        activation_dropout=0.0,
        cross_attention_window=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int(num_heads=num_heads, d_ff=d_ff)
        self.store_hyperparameters(locals())
        # As in `EncoderLayer`, each sub-block gets the settings it shares with this layer.
        attention = dict(self.shared_hyperparameters(AttentionSublayer), dtype=self.dtype_policy)
        self.self_attention = AttentionSublayer(**attention, causal=True, name="self_attention")
        # `sliding_window` limits self-attention only; cross-attention has a
        # window of its own, centred where each target position predicts its
        # source is (a window around the target position's own index would
        # assume the two sentences line up word by word).
        cross = dict(attention, sliding_window=None)
        if cross_attention_window is not None:
            cross.update(sliding_window=cross_attention_window, window_alignment="predictive")
        self.cross_attention_block = (
            AttentionSublayer(**cross, name="cross_attention")
            if cross_attention
            else None
        )
        self.feed_forward = FeedForwardSublayer(
            **self.shared_hyperparameters(FeedForwardSublayer), dtype=self.dtype_policy, name="feed_forward"
        )
        self.supports_masking = True

    def build(self, inputs_shape, encoder_outputs_shape=None):
        check_heads_divide(inputs_shape[-1], self.num_heads)
        self.self_attention.build(inputs_shape)
        if self.cross_attention_block is not None:
            self.cross_attention_block.build(inputs_shape, encoder_outputs_shape or inputs_shape)
        self.feed_forward.build(inputs_shape)

    def compute_cross_attention_cache(self, encoder_outputs):
        """Project the encoder output to this layer's keys and values, once."""
        return self.cross_attention_block.attention.compute_cache(encoder_outputs)

    def empty_self_attention_cache(self, batch_size, max_length):
        return self.self_attention.attention.empty_cache(batch_size, max_length)

    def call(
        self,
        inputs,
        encoder_outputs=None,
        padding_mask=None,
        encoder_padding_mask=None,
        training=None,
        return_attention_scores=False,
        cache=None,
        cache_index=None,
        rows_per_source=1,
    ):
        check_positive_int(rows_per_source=rows_per_source)
        if padding_mask is None:
            padding_mask = keras_mask(inputs)
        if encoder_padding_mask is None and encoder_outputs is not None:
            encoder_padding_mask = keras_mask(encoder_outputs)
        cache = dict(cache) if cache is not None else None
        scores = {}

        def run(block, name, block_inputs, block_mask, **arguments):
            """Call one sub-block; file its scores and cache under `name`."""
            results = block(
                block_inputs,
                inputs_mask=block_mask,
                training=training,
                return_attention_scores=return_attention_scores,
                **arguments,
            )
            if not isinstance(results, tuple):
                return results
            results = list(results)
            block_outputs = results.pop(0)
            if return_attention_scores:
                scores[name] = results.pop(0)
            if results:
                cache[name] = results.pop(0)
            return block_outputs

        outputs = run(
            self.self_attention,
            "self_attention",
            inputs,
            padding_mask,
            cache=cache["self_attention"] if cache is not None else None,
            cache_index=cache_index,
        )
        if self.cross_attention_block is not None:
            cross_cache = cache.get("cross_attention") if cache is not None else None
            if encoder_outputs is None and cross_cache is None:
                raise ValueError(
                    "this DecoderLayer has cross-attention: pass encoder_outputs "
                    "(or a cache holding 'cross_attention')"
                )
            queries, queries_mask = outputs, padding_mask
            if rows_per_source > 1:  # a sentence's rows as positions of one row: consecutive, so a reshape
                rows, length, width = (ops.shape(outputs)[axis] for axis in range(3))
                queries = ops.reshape(outputs, (-1, rows_per_source * length, width))
                if padding_mask is not None:
                    queries_mask = ops.reshape(padding_mask, (-1, rows_per_source * length))
            outputs = run(
                self.cross_attention_block,
                "cross_attention",
                queries,
                queries_mask,
                context=None if cross_cache is not None else encoder_outputs,
                context_mask=encoder_padding_mask,
                cache=cross_cache,
            )
            if rows_per_source > 1:
                outputs = ops.reshape(outputs, (rows, length, width))
                if return_attention_scores:
                    scores["cross_attention"] = _positions_as_rows(scores["cross_attention"], rows_per_source, length)
        outputs = self.feed_forward(outputs, training=training)

        results = (outputs,)
        if return_attention_scores:
            results += (scores,)
        if cache is not None:
            results += (cache,)
        return results[0] if len(results) == 1 else results

    def compute_output_shape(self, inputs_shape, encoder_outputs_shape=None):
        return inputs_shape


@keras.saving.register_keras_serializable(package="keras_transformer")
class Decoder(TransformerStack):
    """Target ids -> embeddings + positions -> dropout -> N `DecoderLayer`s.

    Args:
        The same as `Encoder`, plus `cross_attention` (False for a
        decoder-only language model) and `cross_attention_window` (local
        cross-attention, see `DecoderLayer`). `sliding_window` limits causal self-attention to the
        previous w positions.

    Call arguments:
        token_ids: `(batch, length)` target ids (shifted right: they start
            with the start token), 0 = padding.
        encoder_outputs: `(batch, source_length, d_model)`.
        encoder_padding_mask: `(batch, source_length)`; taken from the Keras
            mask of `encoder_outputs` when not given.
        training: whether dropout is active.
        return_attention_scores: also return a dict from
            "layer_{i}/self_attention" and "layer_{i}/cross_attention" to
            `(batch, heads, q_len, k_len)`.
        cache: from `build_cache`; then `token_ids` are the new positions.
        cache_index: how many positions the cache already holds.
        rows_per_source: consecutive rows of `token_ids` per row of
            `encoder_outputs` or of the cross-attention cache (see the
            module docstring).

    Returns:
        `(batch, length, d_model)`, then scores when asked, then the updated
        cache when given.

    Example:
    >>> decoder = Decoder(num_layers=2, vocab_size=1000, d_model=64, num_heads=4,
    ...                   d_ff=128, max_length=50)
    >>> memory = keras.ops.zeros((2, 7, 64))
    >>> decoder(keras.ops.ones((2, 5), "int32"), memory).shape  # (2, 5, 64)
    """

    hyperparameters = TransformerStack.hyperparameters + DecoderLayer.hyperparameters

    def __init__(self, *args, cross_attention=True, cross_attention_window=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.store_hyperparameters(locals())  # the cross-attention settings; the base stored the rest
        self.decoder_layers = self._make_layers(DecoderLayer)

    def build(self, token_ids_shape, encoder_outputs_shape=None):
        hidden_shape = self._build_common(token_ids_shape)
        for layer in self.decoder_layers:
            layer.build(hidden_shape, encoder_outputs_shape)

    def build_cache(self, batch_size, max_length, encoder_outputs=None):
        """Per-layer caches for decoding up to `max_length` target positions."""
        if isinstance(max_length, int):
            check_positive_int(max_length=max_length)
        caches = []
        for layer in self.decoder_layers:
            cache = {"self_attention": layer.empty_self_attention_cache(batch_size, max_length)}
            if self.cross_attention:
                if encoder_outputs is None:
                    raise ValueError("build_cache needs encoder_outputs for a decoder with cross-attention")
                cache["cross_attention"] = layer.compute_cross_attention_cache(encoder_outputs)
            caches.append(cache)
        return caches

    def call(
        self,
        token_ids,
        encoder_outputs=None,
        encoder_padding_mask=None,
        training=None,
        return_attention_scores=False,
        cache=None,
        cache_index=None,
        rows_per_source=1,
    ):
        if encoder_padding_mask is None and encoder_outputs is not None:
            encoder_padding_mask = keras_mask(encoder_outputs)
        if cache is not None and cache_index is None:
            raise ValueError("a decoding cache needs cache_index, the number of positions it holds")
        start_index = 0 if cache_index is None else cache_index
        target_mask = None if cache is not None else padding_mask(token_ids)
        outputs = self.embedding(token_ids, start_index=start_index, training=training)
        scores, new_cache = {}, []
        for index, layer in enumerate(self.decoder_layers):
            results = layer(
                outputs,
                encoder_outputs,
                padding_mask=target_mask,
                encoder_padding_mask=encoder_padding_mask,
                training=training,
                return_attention_scores=return_attention_scores,
                cache=cache[index] if cache is not None else None,
                cache_index=cache_index,
                rows_per_source=rows_per_source,
            )
            results = list(results) if isinstance(results, tuple) else [results]
            outputs = results.pop(0)
            if return_attention_scores:
                scores.update(self._prefixed_scores(index, results.pop(0)))
            if cache is not None:
                new_cache.append(results.pop(0))
        outputs = self._finish(outputs)

        results = (outputs,)
        if return_attention_scores:
            results += (scores,)
        if cache is not None:
            results += (new_cache,)
        return results[0] if len(results) == 1 else results

    def compute_output_shape(self, token_ids_shape, encoder_outputs_shape=None):
        return tuple(token_ids_shape) + (self.d_model,)
