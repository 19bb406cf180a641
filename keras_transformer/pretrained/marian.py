"""OPUS-MT's Marian checkpoints (Hugging Face `MarianMTModel`) as our Transformer.

Marian is the paper's model with a few choices of its own, each an option of ours:

    post-LN layers, LayerNorm epsilon 1e-5     norm_first=False, epsilon=1e-5
    static sinusoids, sines then cosines       position={"columns": "blocked"}
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

from keras_transformer.pretrained import settings
from keras_transformer.pretrained.checkpoint import (
    ADDED_TOKENS,
    SPECIAL_TOKENS_MAP,
    CheckpointError,
    read_json_file,
)
from keras_transformer.saving import write_json
from keras_transformer.pretrained.weights import SHARED_EMBEDDINGS, assign_all, model_weights, shared_embeddings_name
from keras_transformer.text.sentencepiece import ID_OFFSET, SentencePieceSettings, SentencePieceTokenizer

MODEL_TYPE = "marian"
SOURCE_SPM, TARGET_SPM, VOCAB, TARGET_VOCAB = "source.spm", "target.spm", "vocab.json", "target_vocab.json"
TOKENIZER_FILES = f"{SOURCE_SPM}, {TARGET_SPM} and {VOCAB}"
TOKENIZER_CONFIG = "tokenizer_config.json"
# Everything the tokenizer reads, as `save_pretrained` writes it.
CHECKPOINT_FILES = (SOURCE_SPM, TARGET_SPM, VOCAB, TARGET_VOCAB, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP, ADDED_TOKENS)
# The padding token a vocabulary learned here gains, as its last token (`weights.VocabularyRows`).
PAD = "<pad>"
# Marian's sinusoids: the paper's, every sine before every cosine (`layers.positional.positional_encoding`).
POSITIONS = {"columns": "blocked"}


def transformer_settings(config):
    """`models.Transformer` arguments for a Marian `config.json` (refused in one line where ours cannot follow)."""
    shared = config.get("share_encoder_decoder_embeddings", True)
    vocab_size = config["vocab_size"]
    target_vocab_size = config.get("decoder_vocab_size") or vocab_size
    if shared and target_vocab_size != vocab_size:
        raise CheckpointError(
            f"share_encoder_decoder_embeddings with vocab_size={vocab_size} but decoder_vocab_size={target_vocab_size}"
        )
    result = settings.transformer_settings(config, norm_first=False, position=POSITIONS)
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
        special_tokens=tuple(tokenizer_config.get("additional_special_tokens") or ()),
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
    source = SentencePieceTokenizer(source_model, source_vocab, SentencePieceSettings(
        pad_token=tokenizer_config.get("pad_token", "<pad>"), prefix_tokens=prefix, **special))
    target_settings = SentencePieceSettings(start_token=target_vocab[config["decoder_start_token_id"]],
                                            pad_token=target_vocab[config["pad_token_id"]], **special)
    target = SentencePieceTokenizer(
        settings.read_bytes(directory, TARGET_SPM, TOKENIZER_FILES), target_vocab, target_settings,
        # A shared vocabulary decodes with the source side's model, as MarianTokenizer.decode does.
        decode_model=None if separate else source_model,
    )
    return source, target


def weights(model, shared_name=SHARED_EMBEDDINGS):
    """Every variable of `model` (built with `transformer_settings`) with its checkpoint tensors (`weights.Weight`).

    `final_logits_bias` is a buffer some checkpoints leave out (zeros then).
    """
    return model_weights(model, output_bias="final_logits_bias", shared_name=shared_name)


def assign_weights(model, read, config):
    """Copy the checkpoint's tensors (`read(name)`) into `model`, built with `transformer_settings(config)`."""
    assign_all(weights(model, shared_embeddings_name(read)), read)


# -- a run trained here, as a Marian checkpoint -------------------------------------------------


def checkpoint_config(model, vocab_sizes, pad_id, start_id, end_id, dtype):
    """`config.json` of `model` as Marian (`transformer_settings` inverted); `vocab_sizes`: (source, target)."""
    return settings.checkpoint_config(
        model, architectures=["MarianMTModel"], model_type=MODEL_TYPE, vocab_size=vocab_sizes[0],
        decoder_vocab_size=vocab_sizes[1], share_encoder_decoder_embeddings=model.share_embeddings,
        pad_token_id=pad_id, eos_token_id=end_id, decoder_start_token_id=start_id,
        # Said, not left out: MarianConfig's default forces id 0 at the length limit (</s> in OPUS-MT's
        # vocabularies, <unk> in ours), which our searches do not.
        forced_eos_token_id=None, bos_token_id=None, dtype=dtype,
    )


def write_tokenizer(directory, vocabs, models, separate, languages=(None, None), max_length=512):
    """The files `MarianTokenizer` reads: `source.spm`, `target.spm`, `vocab.json` [`target_vocab.json`], settings.

    `vocabs`: (source, target) token lists in id order, `PAD` among them;
    `models`: (source, target) SentencePiece models' bytes; `languages`:
    (source, target) codes, or None where the run does not say.
    """
    for name, model in zip((SOURCE_SPM, TARGET_SPM), models):
        with open(os.path.join(directory, name), "wb") as file:
            file.write(model)
    for name, vocab in zip((VOCAB, TARGET_VOCAB) if separate else (VOCAB,), vocabs):
        write_json(os.path.join(directory, name), {token: index for index, token in enumerate(vocab)})
    special = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": PAD}
    write_json(os.path.join(directory, TOKENIZER_CONFIG), {
        "tokenizer_class": "MarianTokenizer", "separate_vocabs": separate, "source_lang": languages[0],
        "target_lang": languages[1], "model_max_length": max_length, "sp_model_kwargs": {}, **special,
    })
    write_json(os.path.join(directory, SPECIAL_TOKENS_MAP), special)
