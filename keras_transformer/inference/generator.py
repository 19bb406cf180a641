"""Text in, text out for a language model: tokenizer + sampler + detokenizer in one graph.

`Generator` is to a `LanguageModel` what `Translator` is to a `Transformer`:
the object `keras-transformer generate` uses, and the one the export saves,
so the CLI and a server continue a prompt with the same code. Its sampling
settings may be tensors, which is how the export takes them per request.

    prompt -> [START] + pieces (the last ones, if the prompt is longer than
    the model can read beside what it writes) -> sample on the key/value
    cache -> pieces -> text
"""

import tensorflow as tf

from keras_transformer.inference.decoding import Decoding
from keras_transformer.inference.sampling import SamplingSettings, sample
from keras_transformer.text.portable import dense_rows
from keras_transformer.inference.steps import language_model_prefill, language_model_step


def settings_rules(temperature, top_k, top_p, max_new_tokens, max_length):
    """`[(condition, message), ...]`: what sampling settings must be, for Python values and tensors alike.

    `keras-transformer generate` raises a ValueError on the first condition
    that is false; the export asserts them all in the graph. One list, so
    that both refuse the same requests with the same words.
    """
    return [
        (tf.math.is_finite(tf.cast(temperature, tf.float32)) & (temperature >= 0), "temperature must be >= 0"),
        (top_k >= 0, "top_k must be >= 0 (0: no limit)"),
        ((top_p > 0) & (top_p <= 1), "top_p must be in (0, 1] (1: no limit)"),
        ((max_new_tokens >= 1) & (max_new_tokens < max_length),
         f"max_new_tokens must be in [1, {max_length - 1}] (below the model's max_length {max_length})"),
    ]


def check_settings(temperature, top_k, top_p, max_new_tokens, max_length):
    """A ValueError naming the first setting out of range (Python values)."""
    for condition, message in settings_rules(temperature, top_k, top_p, max_new_tokens, max_length):
        if not bool(condition):
            raise ValueError(f"{message}; got temperature={temperature}, top_k={top_k}, top_p={top_p}, "
                             f"max_new_tokens={max_new_tokens}")


def framed_prompts(pieces, start_id, room):
    """`(ids, lengths)`: [START] and each prompt's last `room - 1` pieces, `(batch, width)` int32 right-padded with 0.

    `pieces`: ragged `(batch, None)` ids. Gathers only, no ragged op: a LiteRT
    file frames its prompts with this too (`export.litert`).
    """
    piece_counts = tf.cast(pieces.row_lengths(), tf.int32)
    padded = dense_rows(pieces, tf.reduce_max(tf.concat([piece_counts, [1]], axis=0)))
    return framed_padded_prompts(padded, piece_counts, start_id, room)


def framed_padded_prompts(padded, piece_counts, start_id, room):
    """`framed_prompts` of `(batch, >= 1)` pieces, each row's `piece_counts` first and 0 after them."""
    kept = tf.minimum(piece_counts, room - 1)
    width = tf.reduce_max(tf.concat([kept, [0]], axis=0)) + 1
    # Column j >= 1 holds piece (count - kept) + j - 1: the last ones are the ones the continuation follows.
    columns = tf.range(width)[None, :]
    source = tf.clip_by_value(piece_counts[:, None] - kept[:, None] + columns - 1, 0, tf.shape(padded)[1] - 1)
    inside = tf.gather(padded, source, batch_dims=1)
    ids = tf.where(columns == 0, start_id, tf.where(columns <= kept[:, None], inside, 0))
    return ids, kept + 1


class Generator(tf.Module):
    """Continue prompts with a trained `LanguageModel` and its tokenizer.

    Args:
        model: a `keras_transformer.models.LanguageModel`.
        tokenizer: the `WordPieceTokenizer` it was trained with.
        temperature, top_k, top_p, max_new_tokens: the default settings (see
            `sampling.sample`); top_k 0 and top_p 1 mean no limit.

    Call arguments:
        texts: `(batch,)` prompts.
        seed, temperature, top_k, top_p, max_new_tokens: this call's settings
            (Python values or scalar tensors; None: the defaults).

    Returns:
        `{"text": (batch,) the prompt as the model read it and its continuation,
        "continuation": (batch,) the new text alone, "new_tokens": (batch,)
        int32, "tokens": (batch, length) int32 ids, [START] first, 0 after}`.
        A prompt longer than `max_length - max_new_tokens` tokens keeps
        [START] and its last pieces; an empty prompt starts from [START].

    Example:
    >>> generator = Generator(model, tokenizer, top_p=0.9)
    >>> generator(tf.constant(["This movie was"]), seed=1)["text"]
    """

    def __init__(self, model, tokenizer, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=60):
        super().__init__(name="generator")
        if model.vocab_size != tokenizer.vocab_size:
            raise ValueError(
                f"the model has {model.vocab_size} token ids but the tokenizer's vocabulary has {tokenizer.vocab_size}"
            )
        check_settings(temperature, top_k, top_p, max_new_tokens, model.max_length)
        self.model = model
        self.tokenizer = tokenizer
        self.defaults = {"temperature": float(temperature), "top_k": int(top_k), "top_p": float(top_p),
                         "max_new_tokens": int(max_new_tokens)}

    def prompt_ids(self, texts, max_new_tokens):
        """`(ids, lengths)`: `(batch, width)` int32 prompts, right-padded, each at most `max_length - max_new_tokens`."""
        return framed_prompts(self.tokenizer.tokenize(texts, add_start_end=False), self.tokenizer.start_id,
                              self.model.max_length - max_new_tokens)

    def generate(self, texts, seed=0, temperature=None, top_k=None, top_p=None, max_new_tokens=None):
        settings = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "max_new_tokens": max_new_tokens}
        settings = {name: self.defaults[name] if value is None else value for name, value in settings.items()}
        if not any(tf.is_tensor(value) for value in settings.values()):  # tensors: the export checks them in the graph
            check_settings(**settings, max_length=self.model.max_length)
        prompts, prompt_lengths = self.prompt_ids(texts, settings["max_new_tokens"])
        tokens, lengths = self.sample(prompts, prompt_lengths, SamplingSettings(**settings, seed=seed))
        # The sampler's buffer has room for the longest allowed text; keep the columns used.
        return self.outputs(tokens[:, : tf.reduce_max(tf.concat([lengths, [1]], axis=0))], lengths, prompt_lengths)

    def sample(self, prompts, prompt_lengths, settings, cache_policy=None):
        """`(tokens, lengths)` of `sampling.sample` with `settings`, on the model's key/value cache.

        `cache_policy`: how the cache is written (default: TensorFlow's in
        place, `inference.decoding`; a runtime may bring its own).
        """
        cache_policy = cache_policy or Decoding().cache_policy(rows_per_source=1)
        rows, width = tf.shape(prompts)[0], tf.shape(prompts)[1]
        step_fn, cache = language_model_step(self.model, rows, width + settings.max_new_tokens,
                                             cache_policy=cache_policy)
        tokenizer = self.tokenizer
        return sample(step_fn, cache, prompts, prompt_lengths, tokenizer.end_id, settings,
                      never=(tokenizer.pad_id, tokenizer.start_id),
                      prefill_fn=language_model_prefill(self.model, cache_policy))

    def outputs(self, tokens, lengths, prompt_lengths):
        """The texts of sampled `tokens`: the whole text, what follows the prompt, and how many tokens that is.

        The continuation is the text written from the first new token on, its
        spacing decided with the prompt before it (a new piece, `##s`, may
        end the prompt's last word).
        """
        return {
            "text": self.tokenizer.detokenize(tokens),
            "continuation": self.tokenizer.detokenize(tokens, first=prompt_lengths),
            "new_tokens": lengths - prompt_lengths,
            "tokens": tokens,
        }

    def __call__(self, texts, seed=0, temperature=None, top_k=None, top_p=None, max_new_tokens=None):
        return self.generate(tf.convert_to_tensor(texts, tf.string), seed, temperature, top_k, top_p, max_new_tokens)

    def attention_scores(self, tokens):
        """Every self-attention map of the model over `tokens` (as `generate` returns them).

        One pass over the whole text: row t of a map is what the model
        attended to when it predicted token t + 1. A dict from names such as
        "decoder/layer_0/self_attention" to float32 `(batch, heads, length, length)`;
        rows of padding are zero.
        """
        _, scores = self.model(tokens, training=False, return_attention_scores=True)
        real = tf.cast(tokens != 0, tf.float32)[:, None, :, None]
        return {name: tf.cast(value, tf.float32) * real for name, value in scores.items()}

    def attention_maps(self, texts, seed=0):
        """Continuations with every attention map, as NumPy, for plots and callbacks (eager).

        Returns one `{"text", "continuation", "tokens", "attention"}` per
        prompt: `tokens` the text's token strings ([START] first), and
        `attention[name]` `(heads, tokens, tokens)`.
        """
        outputs = self(tf.constant(list(texts), tf.string), seed=seed)
        scores = {name: value.numpy() for name, value in self.attention_scores(outputs["tokens"]).items()}
        results = []
        for row, ids in enumerate(outputs["tokens"].numpy()):
            length = int((ids != 0).sum())
            tokens = [token.decode("utf-8") for token in self.tokenizer.id_to_token(ids[:length]).numpy()]
            results.append({
                "text": outputs["text"][row].numpy().decode("utf-8"),
                "continuation": outputs["continuation"][row].numpy().decode("utf-8"),
                "tokens": tokens,
                "attention": {name: value[row, :, :length, :length] for name, value in scores.items()},
            })
        return results
