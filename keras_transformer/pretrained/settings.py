"""What Marian and M2M100 checkpoints share: their config.json keys, and how their tokenizer files are read.

Both are BART-style encoder-decoders in Hugging Face: the same config keys
(`d_model`, `encoder_layers`, `encoder_ffn_dim`, `activation_function`, ...),
the same layer names (see `weights`), LayerNorm epsilon 1e-5, and a
`vocab.json` beside a SentencePiece model. Each family module adds what is
its own (positions, pre- or post-LN, output bias, tokenizer framing).
"""

import os

from keras_transformer.pretrained.checkpoint import CheckpointError, read_json_file
from keras_transformer.text.sentencepiece import ID_OFFSET

# Hugging Face's activation names -> Keras'. "gelu" is the exact one in both.
ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu"}
# ... and back, in the names Marian's configs use ("swish").
CHECKPOINT_ACTIVATIONS = {"silu": "swish", "relu": "relu", "gelu": "gelu"}
EPSILON = 1e-5  # torch.nn.LayerNorm's default, which their layers keep


def same_on_both_sides(config, setting):
    encoder, decoder = config.get(f"encoder_{setting}"), config.get(f"decoder_{setting}")
    if encoder != decoder:
        raise CheckpointError(
            f"encoder_{setting}={encoder} differs from decoder_{setting}={decoder}: our Transformer has one "
            f"{setting.replace('_', ' ')} for both stacks"
        )
    return encoder


def transformer_settings(config, **family):
    """The `models.Transformer` arguments both families read the same way, plus `family`'s own."""
    activation = config.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise CheckpointError(
            f"activation_function={activation!r} is not supported (supported: {', '.join(sorted(ACTIVATIONS))})"
        )
    if not config.get("scale_embedding", False):
        raise CheckpointError("scale_embedding=false is not supported: our embeddings are scaled by sqrt(d_model)")
    return dict(
        src_vocab_size=config["vocab_size"] + ID_OFFSET,
        tgt_vocab_size=config["vocab_size"] + ID_OFFSET,
        num_layers=same_on_both_sides(config, "layers"),
        d_model=config["d_model"],
        num_heads=same_on_both_sides(config, "attention_heads"),
        d_ff=same_on_both_sides(config, "ffn_dim"),
        dropout=config.get("dropout", 0.1),
        attention_dropout=config.get("attention_dropout", 0.0),
        activation_dropout=config.get("activation_dropout", 0.0),
        activation=ACTIVATIONS[activation],
        max_length=config["max_position_embeddings"],
        share_embeddings=True,
        tie_output=config.get("tie_word_embeddings", True),
        epsilon=EPSILON,
        **family,
    )


def checkpoint_config(model, **family):
    """The config.json keys both families write the same way, for `model` (`transformer_settings` inverted), plus `family`'s."""
    both_sides = {}
    for setting, value in (("layers", model.num_layers), ("attention_heads", model.num_heads), ("ffn_dim", model.d_ff)):
        both_sides.update({f"encoder_{setting}": value, f"decoder_{setting}": value})
    return dict(
        is_encoder_decoder=True,
        d_model=model.d_model,
        **both_sides,
        encoder_layerdrop=0.0,
        decoder_layerdrop=0.0,
        dropout=model.dropout,
        attention_dropout=model.attention_dropout,
        activation_dropout=model.activation_dropout,
        activation_function=CHECKPOINT_ACTIVATIONS[model.activation],
        max_position_embeddings=model.max_length,
        scale_embedding=True,
        tie_word_embeddings=model.tie_output,
        init_std=0.02,
        use_cache=True,
        **family,
    )


def read_vocab(directory, name):
    """A `vocab.json` ({token: id}) as the list of tokens in id order (refused when ids are missing)."""
    mapping = read_json_file(directory, name)
    tokens = [None] * len(mapping)
    for token, index in mapping.items():
        if not isinstance(index, int) or not 0 <= index < len(mapping) or tokens[index] is not None:
            raise CheckpointError(f"{os.path.join(directory, name)} does not number its tokens 0..{len(mapping) - 1}")
        tokens[index] = token
    return tokens


def read_bytes(directory, name, needed):
    """A tokenizer file's bytes; `needed` names the files the family's tokenizer needs (for the refusal)."""
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        raise CheckpointError(f"{directory} has no {name}: the tokenizer needs {needed}")
    with open(path, "rb") as file:
        return file.read()
