"""The decoder (Section 3.1, right half of Figure 1).

"In addition to the two sub-layers in each encoder layer, the decoder inserts
a third sub-layer, which performs multi-head attention over the output of the
encoder stack. ... This masking, combined with fact that the output
embeddings are offset by one position, ensures that the predictions for
position i can depend only on the known outputs at positions less than i."

`DecoderLayer.call` and `Decoder.call` are the paper's full pass over a
target sentence. Decoding one token at a time has its own methods beside
them:

**Incremental decoding.** The decoder's state comes in two parts, one
shape each, from the model to the search and back:

    cache:  [(keys, values), ...]     one pair a layer, each (rows, heads, max_length, head_dim):
                                      the self-attention keys and values so far (`Decoder.build_cache`)
    source: {"keys_values": [(keys, values), ...],   one pair a layer, (sentences, heads, source_length, head_dim)
             "mask": (sentences, source_length),     what every step reads of the source (`Decoder.source_cache`)
             "queries_per_source": k}                optional: the target rows that read each source row (below)

`Decoder.decode_step(new_ids, cache, t, source)` runs only the
new positions t, t+1, ..., and returns `(outputs, updated cache)` (the
cache tensors: `layers.cached_attention`, whose `KeyValueCache` a caller
may replace with its own `cache_policy`); the source is never changed.
Every tensor holds its rows on axis 0, as the searches expect: they
reorder the cache's rows and only cut the source's.

**Several target rows may share a source row.** A search may decode
several rows per source sentence (its hypotheses), which all attend
to the same source. The source then holds one row per sentence and the
cache k rows per sentence, a sentence's rows next to each other. Each
source row serves k consecutive rows of the target
(`DecoderLayer.attend_to_shared_source`): those rows become k query
positions of one row. Every query attends on its own, so the result is the
same; the source's keys and values are stored and read once per sentence,
not once per row, as grouped-query attention shares a key head among query
heads. The shapes say k; a caller that knows it when it traces its loop (a
Python int) puts it in the source as `"queries_per_source"`, so that the
graph regroups nothing for one row a sentence and computes no shapes
otherwise. It is not loop state: the step function adds it each time it
hands the source to the model.
"""

import keras
from keras import ops

from keras_transformer.layers.checks import check_heads_divide, check_positive_int
from keras_transformer.layers.config import Hyperparameters
from keras_transformer.layers.encoder import EncoderLayer
from keras_transformer.layers.masks import keras_mask, padding_mask
from keras_transformer.layers.stack import TransformerStack
from keras_transformer.layers.sublayers import AttentionSublayer, FeedForwardSublayer


def queries_per_source_row(queries, source_keys):
    """How many consecutive rows of `queries` each row of `source_keys` serves; None where the shapes are unknown yet.

    Rows that do not divide evenly among the sentences are refused in one line.
    """
    rows, sentences = ops.shape(queries)[0], ops.shape(source_keys)[0]
    if not (isinstance(rows, int) and isinstance(sentences, int)):
        return None
    if sentences == 0 or rows % sentences:
        raise ValueError(f"decoding {rows} rows on a source of {sentences} sentences: each sentence "
                         "needs the same number of consecutive rows")
    return rows // sentences


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
        sliding_window: D: self-attention sees only the previous D positions.
        cross_attention_window: D, for local cross-attention: each target
            position predicts the source position it is aligned with and sees
            the 2D+1 source positions around it, Gaussian-weighted (Luong et
            al. 2015's local-p; `local_attention.PredictiveLocalAttention`).
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

    Returns:
        `(batch, length, d_model)`, or `(outputs, scores)` when
        `return_attention_scores`. Decoding on a cache: `decode_step`.

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
        attention = dict(self.shared_hyperparameters(AttentionSublayer), dtype=self.dtype_policy, cached=True)
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
    ):
        if padding_mask is None:
            padding_mask = keras_mask(inputs)
        if encoder_padding_mask is None and encoder_outputs is not None:
            encoder_padding_mask = keras_mask(encoder_outputs)
        scores = {}

        def scored(results, name):
            """A sub-layer's outputs; its attention weights filed under `name` when asked for."""
            if not return_attention_scores:
                return results
            outputs, scores[name] = results
            return outputs

        attending = dict(training=training, return_attention_scores=return_attention_scores)
        outputs = scored(self.self_attention(inputs, inputs_mask=padding_mask, **attending), "self_attention")
        if self.cross_attention_block is not None:
            if encoder_outputs is None:
                raise ValueError("this DecoderLayer has cross-attention: pass encoder_outputs")
            outputs = scored(
                self.cross_attention_block(
                    outputs, encoder_outputs, inputs_mask=padding_mask, context_mask=encoder_padding_mask, **attending
                ),
                "cross_attention",
            )
        outputs = self.feed_forward(outputs, training=training)
        return (outputs, scores) if return_attention_scores else outputs

    def decode_step(self, inputs, cache, cache_index, source_keys_values=None, source_mask=None,
                    queries_per_source=None, cache_policy=None):
        """The layer on new positions `inputs` at `cache_index` (see the module docstring).

        Args:
            inputs: `(rows, new, d_model)`, the positions after the cached ones.
            cache: this layer's self-attention `(keys, values)`.
            cache_index: number of positions already in the self-attention cache.
            source_keys_values: this layer's cross-attention `(keys, values)`
                of the source, one row per sentence: each serves
                `rows // sentences` consecutive rows of `inputs` (a search's
                rows of one sentence).
            source_mask: `(sentences, source_length)`.
            queries_per_source: that `rows // sentences`, where the caller
                knows it (the module docstring); else the shapes say it.
            cache_policy: how the self-attention keeps its cache
                (`cached_attention.KeyValueCache`; default the pair, scattered).

        Returns:
            `(outputs (rows, new, d_model), updated cache)`.
        """
        outputs, cache = self.self_attention.decode_step(inputs, cache, cache_index, cache_policy=cache_policy)
        if self.cross_attention_block is not None:
            if source_keys_values is None:
                raise ValueError("this DecoderLayer has cross-attention: decoding needs the source's keys and values")
            outputs = self.attend_to_shared_source(outputs, source_keys_values, source_mask, queries_per_source)
        return self.feed_forward(outputs), cache

    def attend_to_shared_source(self, queries, source_cache, source_mask, queries_per_source=None):
        """Cross-attention where each source row serves `queries_per_source` consecutive rows of `queries`.

        A source row's query rows become positions of one row, a reshape
        since they are consecutive: every query still attends on its own,
        and the source's keys and values are read once per source row.
        `queries_per_source` None: `rows // sentences`, from the shapes.
        """
        if queries_per_source is None:
            queries_per_source = queries_per_source_row(queries, source_cache[0])
        else:
            check_positive_int(queries_per_source=queries_per_source)
        if queries_per_source == 1:  # one row a sentence: nothing to regroup
            return self.cross_attention_block.decode_step(queries, source_cache, context_mask=source_mask)[0]
        length, width = ops.shape(queries)[1], ops.shape(queries)[2]
        if queries_per_source is None:  # known only when the graph runs: as many groups as the source has rows
            per_sentence = ops.reshape(queries, (ops.shape(source_cache[0])[0], -1, width))
        else:
            per_sentence = ops.reshape(queries, (-1, queries_per_source * length, width))
        outputs, _ = self.cross_attention_block.decode_step(per_sentence, source_cache, context_mask=source_mask)
        # -1, not the rows' count: a graph runtime can size the reshape when it prepares the graph.
        return ops.reshape(outputs, (-1, length, width))

    def compute_output_shape(self, inputs_shape, encoder_outputs_shape=None):
        return inputs_shape


@keras.saving.register_keras_serializable(package="keras_transformer")
class Decoder(TransformerStack):
    """Target ids -> embeddings + positions -> dropout -> N `DecoderLayer`s.

    Args:
        The same as `Encoder`, plus `cross_attention` (False for a
        decoder-only language model) and `cross_attention_window` (local
        cross-attention, see `DecoderLayer`). `sliding_window` limits causal self-attention to the
        previous D positions.

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

    Returns:
        `(batch, length, d_model)`, or `(outputs, scores)` when
        `return_attention_scores`. Decoding on a cache: `decode_step`.

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

    def build_cache(self, batch_size, max_length):
        """The self-attention cache for decoding up to `max_length` target positions: a `(keys, values)` a layer."""
        if isinstance(max_length, int):
            check_positive_int(max_length=max_length)
        return [layer.empty_self_attention_cache(batch_size, max_length) for layer in self.decoder_layers]

    def source_cache(self, encoder_outputs, encoder_padding_mask):
        """What every decoding step reads of the source: `{"keys_values": a (keys, values) a layer, "mask"}`."""
        if not self.cross_attention:
            raise ValueError("a decoder without cross-attention reads no source")
        keys_values = [layer.compute_cross_attention_cache(encoder_outputs) for layer in self.decoder_layers]
        return {"keys_values": keys_values, "mask": encoder_padding_mask}

    def call(
        self,
        token_ids,
        encoder_outputs=None,
        encoder_padding_mask=None,
        training=None,
        return_attention_scores=False,
    ):
        if encoder_padding_mask is None and encoder_outputs is not None:
            encoder_padding_mask = keras_mask(encoder_outputs)
        target_mask = padding_mask(token_ids)
        outputs = self.embedding(token_ids, training=training)
        scores = {}
        for index, layer in enumerate(self.decoder_layers):
            outputs = layer(
                outputs,
                encoder_outputs,
                padding_mask=target_mask,
                encoder_padding_mask=encoder_padding_mask,
                training=training,
                return_attention_scores=return_attention_scores,
            )
            if return_attention_scores:
                outputs, layer_scores = outputs
                scores.update(self._prefixed_scores(index, layer_scores))
        outputs = self._finish(outputs)
        return (outputs, scores) if return_attention_scores else outputs

    def decode_step(self, token_ids, cache, cache_index, source=None, cache_policy=None):
        """The new positions `token_ids` `(rows, new)` at `cache_index`, on `cache` (from `build_cache`).

        `source`: from `source_cache` (a decoder with cross-attention), one
        row per sentence, each serving consecutive rows of `token_ids`, with
        their count as `"queries_per_source"` where the caller knows it (see
        the module docstring). `cache_policy`: how every layer keeps its
        self-attention cache (`cached_attention.KeyValueCache`). Returns
        `(outputs (rows, new, d_model), updated cache)`.
        """
        outputs = self.embedding(token_ids, start_index=cache_index)
        source = source if source is not None else {"keys_values": [None] * len(self.decoder_layers)}
        source_mask, queries_per_source = source.get("mask"), source.get("queries_per_source")
        new_cache = []
        for layer, layer_cache, keys_values in zip(self.decoder_layers, cache, source["keys_values"]):
            outputs, layer_cache = layer.decode_step(outputs, layer_cache, cache_index, keys_values, source_mask,
                                                     queries_per_source, cache_policy)
            new_cache.append(layer_cache)
        return self._finish(outputs), new_cache

    def compute_output_shape(self, token_ids_shape, encoder_outputs_shape=None):
        return tuple(token_ids_shape) + (self.d_model,)
