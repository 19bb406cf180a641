"""Pretrained translation checkpoints from Hugging Face, as our Transformer, tokenizers and decoding settings.

    translator = keras_transformer.pretrained.load_translator("opus-mt-en-de/")
    translator.translate(["The dog sees the cat."])

    model, source_tokenizer, target_tokenizer, decoding = keras_transformer.pretrained.load("opus-mt-en-de/")

A checkpoint directory as Hugging Face saves it (see `checkpoint`) is read
per family (`marian`: OPUS-MT; `m2m100`: M2M100 and NLLB), mapped onto options of our own layers, and
decodes as the checkpoint says (`decoding_settings`: beam size, length limit
and penalty, forbidden and forced tokens). Nothing outside this package
knows Hugging Face's names. `keras-transformer import-hf` writes the result
as a run directory (`runs.translation.import_checkpoint`).
"""

import collections
import dataclasses
import logging

from keras_transformer.pretrained import m2m100, marian
from keras_transformer.pretrained.checkpoint import (
    CheckpointError,
    check_weights_readable,
    generation_settings,
    read_config,
    read_weights,
    weights_file,
)
from keras_transformer.pretrained.weights import WeightReader
from keras_transformer.text.sentencepiece import ID_OFFSET

logger = logging.getLogger("keras_transformer")

FAMILIES = {marian.MODEL_TYPE: marian, m2m100.MODEL_TYPE: m2m100}

# generate() settings that change the output and that our searches do not have, with the value that is
# harmless: a checkpoint that sets another is refused rather than decoded differently.
_UNSUPPORTED_GENERATION = {
    "do_sample": False,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "min_length": 0,
    "min_new_tokens": None,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "exponential_decay_length_penalty": None,
    "sequence_bias": None,
    "constraints": None,
    "force_words_ids": None,
}

Pretrained = collections.namedtuple("Pretrained", ["model", "source_tokenizer", "target_tokenizer", "decoding"])


def family_of(config):
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise CheckpointError(
            f"model_type={model_type!r} is not supported: this version imports {', '.join(sorted(FAMILIES))} checkpoints"
        )
    return FAMILIES[model_type]


def check_generation(generation):
    """Refuse, in one line, a generation setting our searches would not follow."""
    for name, harmless in _UNSUPPORTED_GENERATION.items():
        value = generation.get(name, harmless)
        if value not in (harmless, None) and not (value == [] and harmless is None):
            raise CheckpointError(f"{name}={value!r} is not supported by our searches (it would change the output)")
    if generation.get("early_stopping") not in (None, True, False):
        # "never": Hugging Face waits for hypotheses of every length up to max_length; ours stop sooner.
        raise CheckpointError(f"early_stopping={generation['early_stopping']!r} is not supported by our searches "
                              "(it would change the output)")
    for words in generation.get("bad_words_ids") or ():
        if len(words) != 1:
            raise CheckpointError(f"bad_words_ids with a sequence of {len(words)} tokens {words} is not supported")


def _single_id(generation, config, name):
    value = generation.get(name, config.get(name))
    if isinstance(value, list):
        if len(value) != 1:
            raise CheckpointError(f"{name}={value} (several ids) is not supported")
        value = value[0]
    return value


def decoding_settings(generation, config, model):
    """How the checkpoint decodes, in our ids: its `inference.DecodingSettings`.

    Hugging Face's defaults where the checkpoint says nothing: greedy,
    max_length 20, length_penalty 1.0. `max_length` counts the decoder's
    start token, so an output has at most max_length - 1 tokens (and never
    more than the model has positions).
    """
    from keras_transformer.inference.settings import DecodingSettings, LengthPenalty, TokenRules

    end = _single_id(generation, config, "eos_token_id")
    forced_first = generation.get("forced_bos_token_id")
    forced_end = generation.get("forced_eos_token_id")
    if forced_end is not None and _single_id(generation, config, "forced_eos_token_id") != end:
        raise CheckpointError(f"forced_eos_token_id={forced_end} differs from eos_token_id={end}")
    max_new_tokens = generation.get("max_new_tokens")
    max_output = max_new_tokens if max_new_tokens else generation.get("max_length", 20) - 1
    return DecodingSettings(
        beam_size=int(generation.get("num_beams") or 1),
        # Hugging Face divides by |Y| ** alpha.
        length_penalty=LengthPenalty(alpha=float(generation.get("length_penalty", 1.0)), offset=0.0),
        # Its beam search runs on after num_beams hypotheses have ended, unless early_stopping is true.
        stop_rule="beam_full" if generation.get("early_stopping") is True else "best_live_is_behind",
        # It follows no greedy path beside its beams.
        keep_greedy=False,
        max_output_length=min(int(max_output), model.max_length),
        # No limit relative to the source's length: Hugging Face has none.
        max_extra_length=model.max_length,
        token_rules=TokenRules(
            never=(0, *(words[0] + ID_OFFSET for words in generation.get("bad_words_ids") or ())),
            forced_first=None if forced_first is None else forced_first + ID_OFFSET,
            end_at_limit=forced_end is not None,
            renormalize=bool(generation.get("renormalize_logits", False)),
        ),
    )


def load(checkpoint_dir, source_lang=None, target_lang=None):
    """`Pretrained(model, source_tokenizer, target_tokenizer, decoding)` of a Hugging Face checkpoint directory.

    Everything that can be refused (an unknown family, a setting we cannot
    express, a missing tokenizer file, a `pytorch_model.bin` without
    PyTorch) is refused before the weights are read.

    Example:
    >>> model, source_tokenizer, target_tokenizer, decoding = load("opus-mt-en-de/")
    >>> model.summary()
    """
    from keras_transformer import models

    config = read_config(checkpoint_dir)
    family = family_of(config)
    try:
        settings = family.transformer_settings(config)
        generation = generation_settings(checkpoint_dir, config)
        check_generation(generation)
        weights_file(checkpoint_dir)
        check_weights_readable(checkpoint_dir)
        source_tokenizer, target_tokenizer = family.tokenizers(
            checkpoint_dir, config, source_lang=source_lang, target_lang=target_lang
        )
    except KeyError as error:  # a setting the family needs is missing from config.json
        raise CheckpointError(f"{checkpoint_dir}/config.json has no {error.args[0]!r}: is it a complete checkpoint?") from None
    except CheckpointError:
        raise
    except ValueError as error:  # a tokenizer file that is not what its name says
        raise CheckpointError(f"{checkpoint_dir}: a tokenizer file is damaged: {error}") from None
    model = models.Transformer(**settings)
    model.build(((None, None), (None, None)))
    decoding = decoding_settings(generation, config, model)
    if target_tokenizer.prefix_ids:
        # A target side framed by its language's token starts every output with it (M2M100's
        # forced_bos_token_id, which Hugging Face users pass to generate themselves).
        decoding = decoding.replace(
            token_rules=dataclasses.replace(decoding.token_rules, forced_first=target_tokenizer.prefix_ids[0]))
    if decoding.token_rules.forced_first is None and target_tokenizer.start_id is None:
        raise CheckpointError("the checkpoint names no decoder_start_token_id")
    read = WeightReader(read_weights(checkpoint_dir))
    family.assign_weights(model, read, config)
    unused = read.unused()
    if unused:  # tied copies and fixed tables some checkpoints save: said, in case it is more
        logger.info("%d tensor(s) of the checkpoint not used: %s", len(unused), ", ".join(unused[:4]) + (
            " ..." if len(unused) > 4 else ""))
    return Pretrained(model, source_tokenizer, target_tokenizer, decoding)


def load_translator(checkpoint_dir, source_lang=None, target_lang=None, **overrides):
    """A ready `inference.Translator` for a Hugging Face checkpoint directory (`overrides` of its
    `DecodingSettings`: e.g. `beam_size=1`).

    Example:
    >>> translator = load_translator("opus-mt-en-de/")
    >>> translator.translate(["The dog sees the cat."])
    """
    from keras_transformer.inference import Translator

    model, source_tokenizer, target_tokenizer, decoding = load(checkpoint_dir, source_lang, target_lang)
    return Translator(model, source_tokenizer, target_tokenizer, decoding.replace(**overrides))


__all__ = ["CheckpointError", "FAMILIES", "Pretrained", "decoding_settings", "load", "load_translator"]
