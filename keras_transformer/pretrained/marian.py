"""OPUS-MT's Marian checkpoints (Hugging Face `MarianMTModel`) as our Transformer.

Marian is the paper's model with a few choices of its own, each an option of ours:

    post-LN layers, LayerNorm epsilon 1e-5     norm_first=False, epsilon=1e-5
    static sinusoids, sines then cosines       position="sinusoidal_halves"
    embeddings times sqrt(d_model)             (ours always scale)
    swish (or relu, gelu) in the FFN           activation
    one vocabulary for both sides, or two      share_embeddings
    output = decoder embeddings^T (+ bias)     tie_output, output_bias <- final_logits_bias
    decoding starts from <pad>                 the target tokenizer's start token

The tokenizer is SentencePiece (`source.spm`, `target.spm`) with a
`vocab.json` of its own (`target_vocab.json` too when the sides have separate
vocabularies); texts end with </s>, and a multilingual model reads its
target language from a `>>xxx<<` token in front of the source text.
"""

import os

import numpy as np

from keras_transformer.pretrained import settings
from keras_transformer.pretrained.checkpoint import CheckpointError, read_json_file
from keras_transformer.pretrained.weights import set_embeddings_and_layers, set_output
from keras_transformer.text.sentencepiece import ID_OFFSET, SentencePieceTokenizer

MODEL_TYPE = "marian"
SOURCE_SPM, TARGET_SPM, VOCAB, TARGET_VOCAB = "source.spm", "target.spm", "vocab.json", "target_vocab.json"
TOKENIZER_FILES = f"{SOURCE_SPM}, {TARGET_SPM} and {VOCAB}"
TOKENIZER_CONFIG = "tokenizer_config.json"


def transformer_settings(config):
    """`models.Transformer` arguments for a Marian `config.json` (refused in one line where ours cannot follow)."""
    shared = config.get("share_encoder_decoder_embeddings", True)
    vocab_size = config["vocab_size"]
    target_vocab_size = config.get("decoder_vocab_size") or vocab_size
    if shared and target_vocab_size != vocab_size:
        raise CheckpointError(
            f"share_encoder_decoder_embeddings with vocab_size={vocab_size} but decoder_vocab_size={target_vocab_size}"
        )
    result = settings.transformer_settings(config, norm_first=False, position="sinusoidal_halves")
    result.update(tgt_vocab_size=target_vocab_size + ID_OFFSET, share_embeddings=shared)
    return result


def tokenizers(directory, config, source_lang=None, target_lang=None):
    """`(source, target)` `SentencePieceTokenizer`s that give the ids `MarianTokenizer` gives.

    `target_lang`: for a multilingual model, the `>>xxx<<` code put in front
    of every source text (a text may also start with its own).
    """
    if source_lang:
        raise CheckpointError("--source-lang is for M2M100: a Marian model reads its source language(s) as they come")
    tokenizer_config = read_json_file(directory, TOKENIZER_CONFIG, required=False)
    separate = bool(tokenizer_config.get("separate_vocabs")) or os.path.exists(os.path.join(directory, TARGET_VOCAB))
    source_vocab = settings.read_vocab(directory, VOCAB)
    target_vocab = settings.read_vocab(directory, TARGET_VOCAB) if separate else source_vocab
    if len(target_vocab) != (config.get("decoder_vocab_size") or config["vocab_size"]):
        raise CheckpointError(
            f"the target vocabulary has {len(target_vocab)} tokens but the model {config.get('decoder_vocab_size') or config['vocab_size']}"
        )
    special = dict(
        unk_token=tokenizer_config.get("unk_token", "<unk>"),
        end_token=tokenizer_config.get("eos_token", "</s>"),
        special_tokens=tokenizer_config.get("additional_special_tokens") or (),
        language_code_prefix=True,
    )
    prefix = ()
    if target_lang:
        code = f">>{target_lang}<<"
        if code not in source_vocab:
            codes = sorted(token for token in source_vocab if token.startswith(">>") and token.endswith("<<"))
            raise CheckpointError(
                f"--target-lang {target_lang}: the vocabulary has no {code}"
                + (f" (it has {', '.join(codes[:12])}{' ...' if len(codes) > 12 else ''})" if codes else
                   " (this model has one target language)")
            )
        prefix = (code,)
    source_model = settings.read_bytes(directory, SOURCE_SPM, TOKENIZER_FILES)
    source = SentencePieceTokenizer(
        source_model, source_vocab, pad_token=tokenizer_config.get("pad_token", "<pad>"), prefix_tokens=prefix,
        **special,
    )
    start = target_vocab[config["decoder_start_token_id"]]
    target = SentencePieceTokenizer(
        settings.read_bytes(directory, TARGET_SPM, TOKENIZER_FILES), target_vocab, start_token=start, pad_token=target_vocab[config["pad_token_id"]],
        # A shared vocabulary decodes with the source side's model, as MarianTokenizer.decode does.
        decode_model=None if separate else source_model, **special,
    )
    return source, target


def assign_weights(model, read, config):
    """Copy the checkpoint's tensors (`read(name)`) into `model`, built with `transformer_settings(config)`."""
    set_embeddings_and_layers(model, read)
    # final_logits_bias is a buffer some checkpoints leave out (then zeros).
    bias = read("final_logits_bias") if read.has("final_logits_bias") else np.zeros([model.tgt_vocab_size - ID_OFFSET])
    set_output(model, read, bias)
