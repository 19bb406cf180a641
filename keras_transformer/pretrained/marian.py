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

from keras_transformer.pretrained.checkpoint import CheckpointError, read_json_file
from keras_transformer.pretrained.weights import (
    assign,
    set_layer,
    with_our_padding_bias,
    with_our_padding_row,
)
from keras_transformer.text.sentencepiece import ID_OFFSET, SentencePieceTokenizer

MODEL_TYPE = "marian"
# Hugging Face's activation names -> Keras'. "gelu" is the exact one in both.
ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu"}
EPSILON = 1e-5  # torch.nn.LayerNorm's default, which Marian's layers keep
SOURCE_SPM, TARGET_SPM, VOCAB, TARGET_VOCAB = "source.spm", "target.spm", "vocab.json", "target_vocab.json"
TOKENIZER_CONFIG = "tokenizer_config.json"


def _same_on_both_sides(config, setting):
    encoder, decoder = config.get(f"encoder_{setting}"), config.get(f"decoder_{setting}")
    if encoder != decoder:
        raise CheckpointError(
            f"encoder_{setting}={encoder} differs from decoder_{setting}={decoder}: our Transformer has one "
            f"{setting.replace('_', ' ')} for both stacks"
        )
    return encoder


def transformer_settings(config):
    """`models.Transformer` arguments for a Marian `config.json` (refused in one line where ours cannot follow)."""
    activation = config.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise CheckpointError(
            f"activation_function={activation!r} is not supported (supported: {', '.join(sorted(ACTIVATIONS))})"
        )
    if not config.get("scale_embedding", False):
        raise CheckpointError("scale_embedding=false is not supported: our embeddings are scaled by sqrt(d_model)")
    shared = config.get("share_encoder_decoder_embeddings", True)
    vocab_size = config["vocab_size"]
    target_vocab_size = config.get("decoder_vocab_size") or vocab_size
    if shared and target_vocab_size != vocab_size:
        raise CheckpointError(
            f"share_encoder_decoder_embeddings with vocab_size={vocab_size} but decoder_vocab_size={target_vocab_size}"
        )
    return dict(
        src_vocab_size=vocab_size + ID_OFFSET,
        tgt_vocab_size=target_vocab_size + ID_OFFSET,
        num_layers=_same_on_both_sides(config, "layers"),
        d_model=config["d_model"],
        num_heads=_same_on_both_sides(config, "attention_heads"),
        d_ff=_same_on_both_sides(config, "ffn_dim"),
        dropout=config.get("dropout", 0.1),
        attention_dropout=config.get("attention_dropout", 0.0),
        activation_dropout=config.get("activation_dropout", 0.0),
        activation=ACTIVATIONS[activation],
        max_length=config["max_position_embeddings"],
        share_embeddings=shared,
        tie_output=config.get("tie_word_embeddings", True),
        norm_first=False,
        position="sinusoidal_halves",
        epsilon=EPSILON,
    )


def _read_vocab(directory, name):
    """A `vocab.json` ({token: id}) as the list of tokens in id order (refused when ids are missing)."""
    mapping = read_json_file(directory, name)
    tokens = [None] * len(mapping)
    for token, index in mapping.items():
        if not isinstance(index, int) or not 0 <= index < len(mapping) or tokens[index] is not None:
            raise CheckpointError(f"{os.path.join(directory, name)} does not number its tokens 0..{len(mapping) - 1}")
        tokens[index] = token
    return tokens


def _read_bytes(directory, name):
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        raise CheckpointError(f"{directory} has no {name}: Marian's tokenizer needs {SOURCE_SPM}, {TARGET_SPM} and {VOCAB}")
    with open(path, "rb") as file:
        return file.read()


def tokenizers(directory, config, target_lang=None):
    """`(source, target)` `SentencePieceTokenizer`s that give the ids `MarianTokenizer` gives.

    `target_lang`: for a multilingual model, the `>>xxx<<` code put in front
    of every source text (a text may also start with its own).
    """
    tokenizer_config = read_json_file(directory, TOKENIZER_CONFIG, required=False)
    separate = bool(tokenizer_config.get("separate_vocabs")) or os.path.exists(os.path.join(directory, TARGET_VOCAB))
    source_vocab = _read_vocab(directory, VOCAB)
    target_vocab = _read_vocab(directory, TARGET_VOCAB) if separate else source_vocab
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
    source_model = _read_bytes(directory, SOURCE_SPM)
    source = SentencePieceTokenizer(
        source_model, source_vocab, pad_token=tokenizer_config.get("pad_token", "<pad>"), prefix_tokens=prefix,
        **special,
    )
    start = target_vocab[config["decoder_start_token_id"]]
    target = SentencePieceTokenizer(
        _read_bytes(directory, TARGET_SPM), target_vocab, start_token=start, pad_token=target_vocab[config["pad_token_id"]],
        # A shared vocabulary decodes with the source side's model, as MarianTokenizer.decode does.
        decode_model=None if separate else source_model, **special,
    )
    return source, target


def assign_weights(model, read, config):
    """Copy the checkpoint's tensors (`read(name)`) into `model`, built with `transformer_settings(config)`."""
    if model.share_embeddings:
        name = "model.shared.weight" if read.has("model.shared.weight") else "model.encoder.embed_tokens.weight"
        assign(model.encoder.embedding.embeddings, with_our_padding_row(read(name)), name)
    else:
        for stack, name in ((model.encoder, "model.encoder.embed_tokens.weight"),
                            (model.decoder, "model.decoder.embed_tokens.weight")):
            assign(stack.embedding.embeddings, with_our_padding_row(read(name)), name)
    for index, layer in enumerate(model.encoder.encoder_layers):
        set_layer(layer, read, f"model.encoder.layers.{index}")
    for index, layer in enumerate(model.decoder.decoder_layers):
        set_layer(layer, read, f"model.decoder.layers.{index}", decoder=True)
    # final_logits_bias is a buffer some checkpoints leave out (then zeros).
    bias = read("final_logits_bias") if read.has("final_logits_bias") else np.zeros([model.tgt_vocab_size - ID_OFFSET])
    if model.tie_output:
        assign(model.output_bias, with_our_padding_bias(bias), "final_logits_bias")
    else:
        assign(model.output_projection.kernel, with_our_padding_row(read("lm_head.weight")).T, "lm_head.weight")
        assign(model.output_projection.bias, with_our_padding_bias(bias), "final_logits_bias")
