"""A trained translator as a CTranslate2 model: the other road to production, for CPU inference speed.

CTranslate2 is the inference engine OpenNMT-tf and Marian users deploy
with: a few fused C++ kernels per layer, int8 weights, no TensorFlow at
serving time. `export_ctranslate2` writes our `Transformer` in its format,
and beside it what is needed to turn text into its tokens and back:

    OUT/model.bin, config.json, source_vocabulary.json, target_vocabulary.json   (CTranslate2's)
    OUT/tokenizers/source/, OUT/tokenizers/target/        (the run's tokenizers: WordPiece, or a checkpoint's)
    OUT/keras_transformer.json                        (decoding settings, sizes, quantization)

`CTranslate2Translator(OUT)` translates text with it: our tokenizer makes
the source's pieces ([START] ... [END], cut to the model's `max_length` as
ours are), CTranslate2 decodes them, our detokenizer makes the text.

The weights map one to one onto CTranslate2's `TransformerSpec`: Keras
kernels are (in, out) and its linear weights (out, in); a self-attention's
Q, K and V are one fused linear, a cross-attention's K and V another. Two
settings that do not default to ours are given: LayerNorm's epsilon (1e-6;
its default is 1e-5) and the position table (ours, sinusoidal or learned,
from position 0). What CTranslate2 cannot run (sliding-window or predictive
local attention) is refused by name.

An imported checkpoint converts the same way, with its own special tokens,
position table (Marian's or fairseq's sinusoids) and token rules (bad words
suppressed, a target language as the target prefix, [END] at the limit):
its greedy output is Hugging Face's (tested).

Greedy search gives our translations token for token (tested). Beam search
differs in its rules: CTranslate2 divides a hypothesis' log-probability by
length^alpha, we by GNMT's ((5 + length) / 6)^alpha; it stops on its own
patience rule; and ours also follows the greedy path and keeps it where it
scores better. Beam outputs can differ where hypotheses are close.
"""

import functools
import json
import os

import numpy as np
import tensorflow as tf

from keras_transformer.inference.tracing import graph_function
from keras_transformer.lines import Answers, answer_each
from keras_transformer.saving import directory_written_whole, first_line
from keras_transformer.text import load_tokenizer

SETTINGS = "keras_transformer.json"
TOKENIZERS = "tokenizers"
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "float16", "bfloat16")
# Our feed-forward activations and CTranslate2's names for them.
_ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "silu": "SWISH", "swish": "SWISH"}


def require_ctranslate2():
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise ImportError("CTranslate2 is an optional extra: pip install 'keras-transformer[ctranslate2]'") from None


def check_convertible(model):
    """A ValueError naming what of `model` CTranslate2 cannot run (nothing: it converts)."""
    if model.activation not in _ACTIVATIONS:
        raise ValueError(f"CTranslate2 has no {model.activation!r} activation; it runs {sorted(_ACTIVATIONS)}")
    local = [name for name in ("sliding_window", "cross_attention_window") if getattr(model, name) is not None]
    if local:
        raise ValueError(f"CTranslate2 cannot run local attention ({', '.join(local)}); export a SavedModel instead")


# Our own vocabularies' special tokens; a pretrained checkpoint's come from its tokenizers.
OUR_SPECIAL_TOKENS = {"unk_token": "[UNK]", "bos_token": "[START]", "eos_token": "[END]", "decoder_start_token": "[START]"}


def special_tokens(source_tokenizer, target_tokenizer):
    """CTranslate2's names for the tokenizers' unknown, start and end tokens."""
    vocab = target_tokenizer.vocab
    start = vocab[target_tokenizer.start_id]
    return {"unk_token": vocab[target_tokenizer.unk_id], "bos_token": start, "eos_token": vocab[target_tokenizer.end_id],
            "decoder_start_token": start}


def _array(variable):
    return np.array(variable.numpy(), dtype=np.float32)  # a copy: quantization works in place


def _set_linear(spec, kernel, bias):
    spec.weight = np.ascontiguousarray(kernel.T)
    spec.bias = bias


def _set_norm(spec, layer):
    spec.gamma, spec.beta = _array(layer.gamma), _array(layer.beta)


def _set_attention(spec, sublayer, fused_query):
    """An `AttentionSublayer` into CTranslate2's multi-head attention spec (its LayerNorm included)."""
    weights = sublayer.attention
    d_model = weights.output_kernel.shape[-1]
    query = _array(weights.query_kernel).reshape(d_model, -1)
    key_value = _array(weights.key_value_kernel).reshape(d_model, 2, -1)
    query_bias = _array(weights.query_bias).reshape(-1)
    key_value_bias = _array(weights.key_value_bias).reshape(2, -1)
    output = _array(weights.output_kernel).reshape(-1, d_model)
    kernels = [query, key_value[:, 0], key_value[:, 1]]
    biases = [query_bias, key_value_bias[0], key_value_bias[1]]
    if fused_query:  # self-attention: one linear for Q, K and V
        _set_linear(spec.linear[0], np.concatenate(kernels, axis=1), np.concatenate(biases))
        _set_linear(spec.linear[1], output, _array(weights.output_bias))
    else:  # cross-attention: Q from the decoder, K and V from the encoder's output
        _set_linear(spec.linear[0], query, query_bias)
        _set_linear(spec.linear[1], np.concatenate(kernels[1:], axis=1), np.concatenate(biases[1:]))
        _set_linear(spec.linear[2], output, _array(weights.output_bias))
    _set_norm(spec.layer_norm, sublayer.norm)


def _set_feed_forward(spec, sublayer):
    network = sublayer.feed_forward
    _set_linear(spec.linear_0, _array(network.hidden.kernel), _array(network.hidden.bias))
    _set_linear(spec.linear_1, _array(network.projection.kernel), _array(network.projection.bias))
    _set_norm(spec.layer_norm, sublayer.norm)


def _position_table(model, stack):
    embedding = stack.embedding.position_embedding
    if model.position == "learned":
        return _array(embedding.position_embeddings)
    # The sinusoids as the layer built them: the paper's, Marian's or fairseq's layout.
    return np.array(embedding.encoding, np.float32)


def model_spec(model, source_vocab, target_vocab, special=None):
    """CTranslate2's `TransformerSpec` of `model` (a float32 `keras_transformer.models.Transformer`), validated.

    `special`: CTranslate2's unk/bos/eos/decoder-start token names (`special_tokens`; default ours).
    """
    from ctranslate2.specs import common_spec, transformer_spec

    check_convertible(model)
    spec = transformer_spec.TransformerSpec.from_config(
        model.num_layers, model.num_heads, pre_norm=model.norm_first,
        activation=getattr(common_spec.Activation, _ACTIVATIONS[model.activation]),
    )
    spec.config.layer_norm_epsilon = model.epsilon
    for name, token in (special or OUR_SPECIAL_TOKENS).items():
        setattr(spec.config, name, token)
    spec.encoder.embeddings[0].weight = _array(model.encoder.embedding.embeddings)
    spec.decoder.embeddings.weight = _array(model.decoder.embedding.embeddings)
    spec.encoder.position_encodings.encodings = _position_table(model, model.encoder)
    spec.decoder.position_encodings.encodings = _position_table(model, model.decoder)
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder.encoder_layers):
        _set_attention(layer_spec.self_attention, layer.self_attention, fused_query=True)
        _set_feed_forward(layer_spec.ffn, layer.feed_forward)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder.decoder_layers):
        _set_attention(layer_spec.self_attention, layer.self_attention, fused_query=True)
        _set_attention(layer_spec.attention, layer.cross_attention_block, fused_query=False)
        _set_feed_forward(layer_spec.ffn, layer.feed_forward)
    if model.norm_first:  # pre-LN stacks end with a LayerNorm
        _set_norm(spec.encoder.layer_norm, model.encoder.final_norm)
        _set_norm(spec.decoder.layer_norm, model.decoder.final_norm)
    if model.tie_output:
        spec.decoder.projection.weight = _array(model.decoder.embedding.embeddings)
        spec.decoder.projection.bias = _array(model.output_bias)
    else:
        _set_linear(spec.decoder.projection, _array(model.output_projection.kernel), _array(model.output_projection.bias))
    spec.register_source_vocabulary(list(source_vocab))
    spec.register_target_vocabulary(list(target_vocab))
    spec.validate()
    return spec


def export_ctranslate2(translator, out_dir, quantization=None):
    """Write `translator`'s model, tokenizers and settings as a CTranslate2 model directory `out_dir`.

    Args:
        translator: a `keras_transformer.inference.Translator` (its beam size,
            length penalty and output limits become the defaults of
            `CTranslate2Translator`). A mixed-precision model is converted from
            its float32 weights.
        out_dir: a directory that does not exist yet (nothing is overwritten).
        quantization: None (float32 weights), or one of `QUANTIZATIONS`:
            CTranslate2 stores the weights so, and computes in that type.

    Returns:
        `out_dir`.

    Example:
    >>> export_ctranslate2(translator, "exports/ct2-int8", quantization="int8")
    """
    require_ctranslate2()
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS} (or none), got {quantization!r}")
    if os.path.exists(out_dir):
        raise FileExistsError(f"{out_dir} already exists: pick another directory or remove it first")
    import ctranslate2

    model = translator.model
    source_tokenizer, target_tokenizer = translator.source_tokenizer, translator.target_tokenizer
    spec = model_spec(model, source_tokenizer.vocab, target_tokenizer.vocab,
                      special_tokens(source_tokenizer, target_tokenizer))
    spec.optimize(quantization=quantization)
    # Written under a hidden name and renamed when whole: a kill leaves no half model at `out_dir`.
    with directory_written_whole(out_dir) as staging:
        spec.save(staging)
        translator.source_tokenizer.save(os.path.join(staging, TOKENIZERS, "source"))
        translator.target_tokenizer.save(os.path.join(staging, TOKENIZERS, "target"))
        decoding, rules = translator.settings, translator.settings.token_rules
        settings = {
            "beam_size": decoding.beam_size,
            "length_alpha": decoding.length_penalty.alpha,
            "max_extra_length": decoding.max_extra_length,
            "max_output_length": decoding.max_output_length,
            "max_source_length": model.max_length,
            # The search's token rules, as CTranslate2 takes them (token strings): never generated, forced first.
            "never_tokens": [target_tokenizer.vocab[token_id] for token_id in rules.never],
            "forced_first_token": None if rules.forced_first is None else target_tokenizer.vocab[rules.forced_first],
            "end_at_limit": rules.end_at_limit,
            "source_frame_length": source_tokenizer.frame_length,
            "quantization": quantization or "float32",
            "ctranslate2": ctranslate2.__version__,
        }
        with open(os.path.join(staging, SETTINGS), "w", encoding="utf-8") as file:
            json.dump(settings, file, indent=2)
    return out_dir


class CTranslate2Translator:
    """Translate text with a directory written by `export_ctranslate2`.

    Args:
        model_dir: the directory.
        compute_type: CTranslate2's ("default": what the export was quantized
            to; "float32", "int8", ...).
        threads: CPU threads for one batch.

    Example:
    >>> translator = CTranslate2Translator("exports/ct2")
    >>> translator.translate(["Ein Mann fährt Fahrrad."])
    """

    def __init__(self, model_dir, compute_type="default", threads=0):
        require_ctranslate2()
        import ctranslate2

        model_dir = os.fspath(model_dir)  # a pathlib.Path too: CTranslate2 takes a str
        settings_path = os.path.join(model_dir, SETTINGS)
        if not os.path.isfile(settings_path):
            raise FileNotFoundError(f"{model_dir} is not a CTranslate2 export of keras-transformer (no {SETTINGS})")
        needed = ("beam_size", "length_alpha", "max_extra_length", "max_output_length", "max_source_length")
        try:
            with open(settings_path, encoding="utf-8") as file:
                self.settings = json.load(file)
            missing = [name for name in needed if name not in self.settings]
        except (ValueError, TypeError) as error:  # not JSON, or not an object
            raise ValueError(f"{settings_path} is damaged: {first_line(error)}") from None
        if missing:
            raise ValueError(f"{settings_path} is damaged: it lacks {', '.join(missing)}")
        self.source_tokenizer = load_tokenizer(os.path.join(model_dir, TOKENIZERS, "source"))
        self.target_tokenizer = load_tokenizer(os.path.join(model_dir, TOKENIZERS, "target"))
        # Traced once: run eagerly, the ragged tokenizer ops cost about 80 ms a call, far more than
        # CTranslate2 takes to translate a short sentence.
        self._tokenize = graph_function(
            self.source_tokenizer.tokenize, input_signature=[tf.TensorSpec([None], tf.string)]
        )
        self._detokenize = graph_function(
            self.target_tokenizer.detokenize, input_signature=[tf.TensorSpec([None, None], tf.int32)]
        )
        self._target_index = {token: position for position, token in enumerate(self.target_tokenizer.vocab)}
        # Exports made before token rules were recorded: our own models' rules.
        self._suppressed = [[token] for token in self.settings.get("never_tokens", ["[PAD]", "[START]"])]
        self._prefix = [self.settings["forced_first_token"]] if self.settings.get("forced_first_token") else []
        try:
            self.translator = ctranslate2.Translator(
                model_dir, device="cpu", compute_type=compute_type, inter_threads=1, intra_threads=threads
            )
        except (RuntimeError, ValueError) as error:  # a missing or damaged model.bin, an unknown compute type
            raise ValueError(f"{model_dir} is not a loadable CTranslate2 model: {first_line(error)}") from None

    def source_tokens(self, texts):
        """Each text's pieces as CTranslate2 reads them: [START] ... [END], cut to `max_source_length` keeping [END].

        `lines.Answers`: the token lists, and in `truncated` those cut, with the pieces kept.
        """
        longest = self.settings["max_source_length"]
        pieces_read = longest - self.settings.get("source_frame_length", 2)
        tokens, truncated = [], {}
        for index, ids in enumerate(self._tokenize(tf.constant(list(texts), tf.string)).to_list()):
            if len(ids) > longest:
                ids = ids[: longest - 1] + ids[-1:]
                truncated[index] = pieces_read
            tokens.append([self.source_tokenizer.vocab[token_id] for token_id in ids])
        return Answers(tokens, truncated)

    def _decode(self, sources, beam_size, batch_size):
        """The best hypothesis (tokens, no [END]) of each source, each within its own output limit.

        As ours: an output is at most its source's length plus
        max_extra_length, within the cap. CTranslate2 takes one limit per
        call: greedy search runs once at the longest limit and cuts each
        output to its own (exactly what a search with that limit writes);
        beam search, where a longer limit changes which hypothesis wins, runs
        once per distinct limit. What our searches never produce ([PAD] and
        [START]; a checkpoint's bad words) CTranslate2 suppresses, and a forced
        first token (a target language) is its target prefix.
        """
        limits = [min(len(source) + self.settings["max_extra_length"], self.settings["max_output_length"])
                  for source in sources]
        if self.settings.get("end_at_limit"):
            # The last position is [END]'s (forced): CTranslate2 has no such rule, so it stops one before.
            limits = [limit - 1 for limit in limits]
        groups = {max(limits): list(range(len(sources)))} if beam_size == 1 else {}
        if beam_size > 1:
            for index, limit in enumerate(limits):
                groups.setdefault(limit, []).append(index)
        hypotheses = [None] * len(sources)
        for limit, indices in groups.items():
            results = self.translator.translate_batch(
                [sources[index] for index in indices], beam_size=beam_size, max_batch_size=batch_size,
                length_penalty=self.settings["length_alpha"] if beam_size > 1 else 0,
                max_decoding_length=limit, min_decoding_length=0, suppress_sequences=self._suppressed,
                target_prefix=[self._prefix] * len(indices) if self._prefix else None,
            )
            for index, result in zip(indices, results):
                hypotheses[index] = result.hypotheses[0][: limits[index]]
        return hypotheses

    def translate(self, texts, beam_size=None, batch_size=64):
        """Python strings in, one translation per string out (`lines.Answers`; beam size default: the export's).

        A blank text's translation is "", found without CTranslate2; a text
        cut at `max_source_length` is in the answer's `truncated`.
        """
        beam_size = beam_size or self.settings["beam_size"]
        return answer_each(texts, functools.partial(self._translate_in_batches, beam_size=beam_size,
                                                    batch_size=batch_size), "")

    def _translate_in_batches(self, texts, beam_size, batch_size):
        translations, truncated = [], {}
        frame = self.settings.get("source_frame_length", 2)
        for start in range(0, len(texts), batch_size):
            sources = self.source_tokens(texts[start : start + batch_size])
            ids = [[self._target_index[token] for token in hypothesis] or [0]
                   for hypothesis in self._decode(sources, beam_size, batch_size)]
            width = max(map(len, ids))
            padded = np.array([row + [0] * (width - len(row)) for row in ids], "int32")
            decoded = self._detokenize(padded).numpy()
            # [START] and [END] alone: nothing to translate, as ours.
            translations += [text.decode("utf-8") if len(source) > frame else "" for text, source in zip(decoded, sources)]
            truncated.update((start + row, pieces) for row, pieces in sources.truncated.items())
        return Answers(translations, truncated)
