"""The encoder-decoder Transformer (Section 3, Figure 1).

source ids -> Encoder -> memory
target ids (shifted right) -> Decoder(attending to memory) -> Linear -> logits

"Linear" is the pre-softmax projection of Section 3.4; with `tie_output` it
reuses the target embedding matrix, as the paper does. The softmax itself is
left to the loss (logits are returned, in float32 under mixed precision).
"""

import copy

import keras
from keras import ops

from keras_transformer.layers import Decoder, Encoder
from keras_transformer.layers.config import Hyperparameters
from keras_transformer.layers.masks import keras_mask, padding_mask
from keras_transformer.layers.position_wise import matrix_product, position_wise
from keras_transformer.models.multi_worker import MultiWorkerFit
from keras_transformer.models.attention_maps import DECODER_STACK, ENCODER_STACK, stack_attention_maps

PRESETS = {
    # Table 3 of the paper, "base" and "big" rows.
    "base": {"num_layers": 6, "d_model": 512, "num_heads": 8, "d_ff": 2048, "dropout": 0.1},
    "big": {"num_layers": 6, "d_model": 1024, "num_heads": 16, "d_ff": 4096, "dropout": 0.3},
    # Half the depth and width: the right size for Multi30k's 29k sentence pairs.
    "small": {"num_layers": 3, "d_model": 256, "num_heads": 8, "d_ff": 512, "dropout": 0.1},
}


def _split_inputs(inputs):
    if isinstance(inputs, dict):
        try:
            return inputs["source_ids"], inputs["target_ids"]
        except KeyError:
            raise ValueError(
                f"a dict input needs keys 'source_ids' and 'target_ids', got {sorted(inputs)}"
            ) from None
    if isinstance(inputs, (list, tuple)) and len(inputs) == 2:
        return inputs[0], inputs[1]
    raise ValueError(
        "Transformer inputs must be (source_ids, target_input_ids) or a dict with "
        f"'source_ids' and 'target_ids'; got {type(inputs).__name__}"
    )


# The decoder's settings that the encoder has not: its cross-attention's window.
_DECODER_ONLY = ("cross_attention_window",)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(MultiWorkerFit, Hyperparameters, keras.Model):
    """The encoder-decoder Transformer of "Attention Is All You Need".

    Args:
        src_vocab_size, tgt_vocab_size: vocabulary sizes; id 0 is padding.
        num_layers: N, layers in each of the encoder and decoder.
        d_model, num_heads, d_ff, dropout: sizes of Table 3.
        max_length: longest source or target sequence.
        share_embeddings: one embedding matrix for source and target (needs
            equal vocabulary sizes: a shared sub-word vocabulary).
        tie_output: the pre-softmax projection is the transposed target
            embedding (Section 3.4).
        norm_first: pre-LN layers instead of the paper's post-LN.
        position: "sinusoidal" (the paper's), "learned", or a checkpoint's own sinusoids
            (see `layers.TokenAndPositionEmbedding`).
        epsilon, activation, attention_dropout, activation_dropout,
        sliding_window: passed to every layer.
        cross_attention_window: D, for predictive local cross-attention (see
            `DecoderLayer`); None: global, the paper's.

    Call arguments:
        inputs: `(source_ids, target_input_ids)`, integer `(batch, src_len)`
            and `(batch, tgt_len)`.
        training: whether dropout is active.
        return_attention_scores: also return a dict from names such as
            "encoder/layer_0/self_attention", "decoder/layer_0/self_attention"
            and "decoder/layer_0/cross_attention" to `(batch, heads, q_len, k_len)`.

    Returns:
        logits `(batch, tgt_len, tgt_vocab_size)` float32, or `(logits, scores)`.

    Example:
    >>> model = Transformer.from_preset("small", src_vocab_size=8000, tgt_vocab_size=8000)
    >>> source = keras.ops.ones((2, 12), "int32")
    >>> target = keras.ops.ones((2, 10), "int32")
    >>> model((source, target)).shape  # (2, 10, 8000)
    """

    # The model's own, then every one of its stacks' except the vocabulary
    # size, which is per side here; the two stacks get all of those.
    hyperparameters = ("src_vocab_size", "tgt_vocab_size", "share_embeddings", "tie_output") + tuple(
        name for name in Encoder.hyperparameters if name != "vocab_size"
    ) + _DECODER_ONLY

    def __init__(
        self,
        src_vocab_size,
        tgt_vocab_size,
        num_layers=6,
        d_model=512,
        num_heads=8,
        d_ff=2048,
        dropout=0.1,
        max_length=512,
        share_embeddings=False,
        tie_output=False,
        norm_first=False,
        position="sinusoidal",
        epsilon=1e-6,
        activation="relu",
        attention_dropout=0.0,
        activation_dropout=0.0,
        sliding_window=None,
        cross_attention_window=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if share_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError(
                "share_embeddings needs one vocabulary: src_vocab_size="
                f"{src_vocab_size} differs from tgt_vocab_size={tgt_vocab_size}"
            )
        self.store_hyperparameters(locals())

        stack = dict(self.shared_hyperparameters(Encoder), dtype=self.dtype_policy)
        self.encoder = Encoder(vocab_size=src_vocab_size, name=ENCODER_STACK, **stack)
        self.decoder = Decoder(
            vocab_size=tgt_vocab_size,
            embedding=self.encoder.embedding if share_embeddings else None,
            name=DECODER_STACK,
            **stack,
            **{name: getattr(self, name) for name in _DECODER_ONLY},
        )
        if not tie_output:
            self.output_projection = keras.layers.Dense(
                tgt_vocab_size, dtype=self.dtype_policy, name="output_projection"
            )

    @classmethod
    def from_preset(cls, name, **overrides):
        """Build a preset ("base", "big", "small"); vocabulary sizes go in `overrides`.

        Example:
        >>> Transformer.from_preset("base", src_vocab_size=37000, tgt_vocab_size=37000,
        ...                         share_embeddings=True, tie_output=True)
        """
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        missing = [key for key in ("src_vocab_size", "tgt_vocab_size") if key not in overrides]
        if missing:
            raise ValueError(f"from_preset({name!r}) needs {', '.join(missing)}")
        return cls(**{**copy.deepcopy(PRESETS[name]), **overrides})

    def build(self, inputs_shape):
        source_shape, target_shape = _split_inputs(inputs_shape)
        self.encoder.build(source_shape)
        self.decoder.build(target_shape, tuple(source_shape) + (self.d_model,))
        hidden_shape = tuple(target_shape) + (self.d_model,)
        if self.tie_output:
            self.output_bias = self.add_weight(
                name="output_bias", shape=(self.tgt_vocab_size,), initializer="zeros"
            )
        else:
            self.output_projection.build(hidden_shape)

    # -- the pieces a decoding loop needs ----------------------------------

    def _ensure_built(self):
        # Decoding may start before the model was ever called as a whole.
        if not self.built:
            self.build(((None, None), (None, None)))

    def encode(self, source_ids, training=None, return_attention_scores=False):
        """`(batch, src_len, d_model)` memory, carrying the source padding mask."""
        self._ensure_built()
        return self.encoder(source_ids, training=training, return_attention_scores=return_attention_scores)

    def build_cache(self, encoder_outputs, max_length, encoder_padding_mask=None):
        """The decoder's state for `max_length` target positions: `(cache, source)` (see `layers.decoder`).

        `encoder_padding_mask`: the source's, default the Keras mask `encode` left on `encoder_outputs`.
        """
        self._ensure_built()
        if encoder_padding_mask is None:
            encoder_padding_mask = keras_mask(encoder_outputs)
        cache = self.decoder.build_cache(ops.shape(encoder_outputs)[0], max_length)
        return cache, self.decoder.source_cache(encoder_outputs, encoder_padding_mask)

    def decode(self, target_ids, encoder_outputs, encoder_padding_mask=None, training=None,
               return_attention_scores=False):
        """Logits for `target_ids` (a full pass); `(logits, scores)` when `return_attention_scores`."""
        self._ensure_built()
        decoded = self.decoder(
            target_ids,
            encoder_outputs,
            encoder_padding_mask=encoder_padding_mask,
            training=training,
            return_attention_scores=return_attention_scores,
        )
        if return_attention_scores:
            return self.logits(decoded[0]), decoded[1]
        return self.logits(decoded)

    def decode_step(self, target_ids, cache, cache_index, source, output_kernel=None, cache_policy=None):
        """Logits for the new positions `target_ids` at `cache_index`, on `cache` and `source`: `(logits, cache)`.

        `cache` and `source` are `build_cache`'s (see `layers.decoder`).
        `output_kernel`: with `tie_output`, `tied_output_kernel()` made once
        by a decoding loop (else every step transposes the embeddings).
        The source has a row per sentence, and `target_ids` as many rows
        per sentence as the search keeps (the source's `"queries_per_source"`,
        or its shapes; `layers.decoder`). `cache_policy`: how the decoder's
        self-attention keeps its cache (`layers.cached_attention.KeyValueCache`).
        """
        self._ensure_built()
        outputs, cache = self.decoder.decode_step(target_ids, cache, cache_index, source, cache_policy)
        return self.logits(outputs, output_kernel), cache

    def tied_output_kernel(self):
        """With `tie_output`, the pre-softmax projection's `(d_model, tgt_vocab)` kernel: the embeddings, transposed.

        A decoding loop makes it once and passes it to every step's
        `decode_step(..., output_kernel=...)`: TensorFlow multiplies by a
        matrix stored transposed markedly slower than by one laid out for
        the product (BENCHMARKS.md), and the transposition need not be
        repeated.
        """
        if not self.tie_output:
            raise ValueError("tied_output_kernel is for a Transformer with tie_output=True")
        return ops.transpose(ops.cast(self.decoder.embedding.embeddings, self.compute_dtype))

    def logits(self, decoder_outputs, output_kernel=None):
        """The pre-softmax linear transformation, in float32 (`output_kernel`: see `decode_step`)."""
        if self.tie_output:
            if output_kernel is None:
                output_kernel = self.tied_output_kernel()
            logits = matrix_product(decoder_outputs, ops.cast(output_kernel, decoder_outputs.dtype))
            logits = logits + ops.cast(self.output_bias, logits.dtype)
        else:
            logits = position_wise(self.output_projection, decoder_outputs)
        # Softmax and cross-entropy over a large vocabulary need float32.
        return ops.cast(logits, "float32")

    def call(self, inputs, training=None, return_attention_scores=False):
        source_ids, target_ids = _split_inputs(inputs)
        encoded = self.encode(source_ids, training=training, return_attention_scores=return_attention_scores)
        encoder_outputs, encoder_scores = encoded if return_attention_scores else (encoded, {})
        decoded = self.decode(
            target_ids,
            encoder_outputs,
            encoder_padding_mask=padding_mask(source_ids),
            training=training,
            return_attention_scores=return_attention_scores,
        )
        if not return_attention_scores:
            return decoded
        logits, decoder_scores = decoded
        scores = stack_attention_maps(ENCODER_STACK, encoder_scores)
        scores.update(stack_attention_maps(DECODER_STACK, decoder_scores))
        return logits, scores
