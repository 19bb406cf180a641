"""The decoder on its own: a GPT-style language model.

token ids -> Decoder (causal self-attention only) -> Linear (tied to the embedding) -> logits

The Transformer's decoder without its middle sub-layer: `Decoder(cross_attention=False)`,
the same `DecoderLayer`s with nothing to attend to but the text so far. Trained
to predict every next token (the labels are the inputs shifted left), it is
the model behind GPT (Radford et al., 2018 and 2019). The output projection
reuses the token embedding (Section 3.4 of the paper, and GPT-2's habit).
"""

import copy

import keras
from keras import ops

from keras_transformer.layers import Decoder
from keras_transformer.layers.config import Hyperparameters
from keras_transformer.layers.position_wise import matrix_product
from keras_transformer.models.attention_maps import DECODER_STACK, stack_attention_maps
from keras_transformer.models.multi_worker import MultiWorkerFit

PRESETS = {
    # A size that trains in minutes on a 2-core CPU.
    "small": {"num_layers": 4, "d_model": 256, "num_heads": 4, "d_ff": 1024, "dropout": 0.1, "max_length": 256},
    # GPT-2's smallest (124M parameters with its 50,257-token vocabulary): pre-LN, GELU, learned positions.
    "gpt2-small": {
        "num_layers": 12, "d_model": 768, "num_heads": 12, "d_ff": 3072, "dropout": 0.1, "max_length": 1024,
        "norm_first": True, "activation": "gelu", "position": "learned",
    },
}

# The decoder's settings a language model takes over as they are.
_STACK_SETTINGS = tuple(name for name in Decoder.hyperparameters if name not in ("cross_attention", "cross_attention_window"))


@keras.saving.register_keras_serializable(package="keras_transformer")
class LanguageModel(MultiWorkerFit, Hyperparameters, keras.Model):
    """A decoder-only Transformer that predicts the next token.

    Args:
        vocab_size: number of token ids; id 0 is padding.
        num_layers, d_model, num_heads, d_ff, dropout: the sizes, as in the paper's Table 3.
        max_length: the longest sequence (positions are defined up to it).
        norm_first: pre-LN layers (GPT-2) instead of the paper's post-LN.
        position: "sinusoidal" (the paper's), "learned", or a checkpoint's own sinusoids
            (see `layers.TokenAndPositionEmbedding`).
        epsilon, activation, attention_dropout, activation_dropout,
        sliding_window: passed to every layer.

    Call arguments:
        token_ids: integer `(batch, length)`, 0 = padding at the end.
        training: whether dropout is active.
        return_attention_scores: also return a dict from
            "decoder/layer_{i}/self_attention" to `(batch, heads, length, length)`.

    Returns:
        logits `(batch, length, vocab_size)` float32 (position t predicts
        token t + 1), or `(logits, scores)`.

    Example:
    >>> model = LanguageModel.from_preset("small", vocab_size=8000)
    >>> model(keras.ops.ones((2, 16), "int32")).shape  # (2, 16, 8000)
    """

    hyperparameters = _STACK_SETTINGS

    def __init__(
        self,
        vocab_size,
        num_layers=4,
        d_model=256,
        num_heads=4,
        d_ff=1024,
        dropout=0.1,
        max_length=256,
        norm_first=False,
        position="sinusoidal",
        epsilon=1e-6,
        activation="relu",
        attention_dropout=0.0,
        activation_dropout=0.0,
        sliding_window=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.store_hyperparameters(locals())
        stack = self.shared_hyperparameters(Decoder)
        self.decoder = Decoder(cross_attention=False, name=DECODER_STACK, dtype=self.dtype_policy, **stack)

    @classmethod
    def from_preset(cls, name, **overrides):
        """Build a preset ("small", "gpt2-small"); the vocabulary size goes in `overrides`.

        Example:
        >>> LanguageModel.from_preset("gpt2-small", vocab_size=50257)
        """
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        if "vocab_size" not in overrides:
            raise ValueError(f"from_preset({name!r}) needs vocab_size")
        return cls(**{**copy.deepcopy(PRESETS[name]), **overrides})

    def build(self, token_ids_shape):
        self.decoder.build(token_ids_shape)
        self.output_bias = self.add_weight(name="output_bias", shape=(self.vocab_size,), initializer="zeros")

    def _ensure_built(self):
        # Sampling may start before the model was ever called as a whole.
        if not self.built:
            self.build((None, None))

    def build_cache(self, batch_size, max_length):
        """The self-attention cache for `max_length` positions, a `(keys, values)` a layer (see `layers.decoder`)."""
        self._ensure_built()
        return self.decoder.build_cache(batch_size, max_length)

    def logits(self, hidden):
        """The output projection, tied to the token embedding, in float32."""
        embeddings = ops.cast(self.decoder.embedding.embeddings, hidden.dtype)
        logits = matrix_product(hidden, ops.transpose(embeddings)) + ops.cast(self.output_bias, hidden.dtype)
        # Softmax and cross-entropy over a large vocabulary need float32.
        return ops.cast(logits, "float32")

    def decode(self, token_ids, training=None, return_attention_scores=False):
        """Logits for `token_ids` (a full pass); `(logits, scores)` when `return_attention_scores`."""
        self._ensure_built()
        decoded = self.decoder(token_ids, training=training, return_attention_scores=return_attention_scores)
        if return_attention_scores:
            return self.logits(decoded[0]), decoded[1]
        return self.logits(decoded)

    def decode_step(self, token_ids, cache, cache_index, cache_policy=None):
        """Logits for the new positions `token_ids` at `cache_index`, on `cache`: `(logits, cache)`.

        `cache_policy`: how the self-attention keeps its cache (`layers.cached_attention.KeyValueCache`).
        """
        self._ensure_built()
        outputs, cache = self.decoder.decode_step(token_ids, cache, cache_index, cache_policy=cache_policy)
        return self.logits(outputs), cache

    def call(self, token_ids, training=None, return_attention_scores=False):
        decoded = self.decode(token_ids, training=training, return_attention_scores=return_attention_scores)
        if not return_attention_scores:
            return decoded
        logits, scores = decoded
        return logits, stack_attention_maps(DECODER_STACK, scores)

    def compute_output_shape(self, token_ids_shape):
        return tuple(token_ids_shape) + (self.vocab_size,)
