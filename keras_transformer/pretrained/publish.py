"""A translation run as a Hugging Face checkpoint directory (`keras-transformer export RUN OUT --format hf`).

What `save_pretrained` writes, and so what `MarianMTModel.from_pretrained`
(or M2M100's), CTranslate2's `ct2-transformers-converter` and our own
`import-hf` read:

    config.json, generation_config.json   the architecture, and how it decodes
    model.safetensors                      the weights (`weights.checkpoint_tensors`)
    tokenizer files                        the family's (`marian.CHECKPOINT_FILES`, `m2m100.CHECKPOINT_FILES`)

An imported checkpoint, fine-tuned or not, goes back to its own family
(`write_imported`): its settings and tokenizer files as it came with them
(the run keeps them, `keep_checkpoint_files`), its weights as they are now.
Untrained, they are the checkpoint's own tensors, bit for bit.

A run trained here goes out as Marian (`write_as_marian`), which is the
paper's Transformer (post-LN, static sinusoids, scaled embeddings) over
SentencePiece vocabularies. One difference is only a layout: Marian's
sinusoid has the sines of every frequency in the first half of the model
axis and the cosines in the second, where ours interleave them. Every
weight meets the model axis column by column (LayerNorm's scale and shift)
or through sums over it (matrix products), so the same weights with their
model axis in Marian's order (`layers.positional.blocked_order`) compute the
same function. What Marian cannot express is refused in one line
(`check_marian`), before anything is written.

Marian's LayerNorms add 1e-5 to the variance where ours add 1e-6, and a
Marian config cannot say otherwise: the logits of a run trained here move
by a few parts in a million of their scale (docs/pretrained.md).
"""

import os

from keras_transformer.layers.embedding import sinusoid_choices
from keras_transformer.layers.positional import blocked_order
from keras_transformer.pretrained import family_of, marian
from keras_transformer.pretrained.checkpoint import (
    CONFIG,
    GENERATION_CONFIG,
    SAFETENSORS,
    SAFETENSORS_DTYPES,
    CheckpointError,
    checkpoint_dtype,
    copy_files,
    read_config,
    write_weights,
)
from keras_transformer.pretrained.settings import CHECKPOINT_ACTIVATIONS
from keras_transformer.pretrained.weights import VocabularyRows, checkpoint_tensors
from keras_transformer.saving import write_json
from keras_transformer.text.sentencepiece import ID_OFFSET, SentencePieceTokenizer

SETTINGS_FILES = (CONFIG, GENERATION_CONFIG)
# The model settings a checkpoint's config.json decides (and an imported run must still have to go back).
_ARCHITECTURE = ("src_vocab_size", "tgt_vocab_size", "num_layers", "d_model", "num_heads", "d_ff", "max_length",
                 "share_embeddings", "tie_output", "norm_first", "position", "activation", "epsilon")


def check_run(model, source_tokenizer, target_tokenizer, files_dir):
    """Refuse, in one line and before anything is written, a run that cannot go out as a checkpoint.

    `files_dir`: an imported run's checkpoint files (it goes back to its
    family, which expresses it), or None for a run trained here, which goes
    out as Marian (`check_marian`).
    """
    if files_dir is None:
        check_marian(model, source_tokenizer, target_tokenizer)


def write_run(model, tokenizers, out_dir, files_dir, decoding, languages, dtype=None):
    """Write a run's model into `out_dir`: as the checkpoint it came from (`files_dir`), else as Marian.

    `tokenizers`: (source, target); `decoding`, `languages`, `dtype`: `write_as_marian`'s
    (an imported run keeps its checkpoint's, and its dtype unless `dtype` says another).
    """
    if files_dir is not None:
        write_imported(model, files_dir, out_dir, dtype)
    else:
        write_as_marian(model, *tokenizers, out_dir, decoding, languages, dtype or "float32")


def checkpoint_files(config):
    """A checkpoint's settings and its family's tokenizer files: what an imported run keeps, and writes back."""
    return SETTINGS_FILES + family_of(config).CHECKPOINT_FILES


def keep_checkpoint_files(checkpoint_dir, directory):
    """Copy the checkpoint's settings and tokenizer files (not its weights) into `directory`, for `write_imported`."""
    copy_files(checkpoint_dir, directory, checkpoint_files(read_config(checkpoint_dir)))


def check_dtype(dtype):
    if dtype is not None and dtype not in SAFETENSORS_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(SAFETENSORS_DTYPES)}, got {dtype!r}")


# -- an imported checkpoint, back to its family -------------------------------------------------


def write_imported(model, files_dir, out_dir, dtype=None):
    """Write `model` (an imported run's, fine-tuned or not) into `out_dir` as the checkpoint it came from.

    `files_dir`: the checkpoint's settings and tokenizer files (`keep_checkpoint_files`);
    `dtype`: the weights' ("float32", "float16", "bfloat16"; default what
    its config.json says, as it came; another is written into config.json).
    """
    config = read_config(files_dir)
    family = family_of(config)
    expected = family.transformer_settings(config)
    for name in _ARCHITECTURE:
        if getattr(model, name) != expected[name]:
            raise CheckpointError(f"the run's {name} is {getattr(model, name)!r} but its checkpoint's config.json "
                                  f"says {expected[name]!r}: it is no longer that checkpoint's model")
    copy_files(files_dir, out_dir, checkpoint_files(config))
    if dtype and dtype != checkpoint_dtype(config):
        dtype_keys = [key for key in ("dtype", "torch_dtype") if key in config] or ["dtype"]
        write_json(os.path.join(out_dir, CONFIG), {**config, **{key: dtype for key in dtype_keys}})
    rows = VocabularyRows(padding_kept=False)  # the checkpoint's vocabulary has its own padding
    weights = family.weights(model)
    write_weights(os.path.join(out_dir, SAFETENSORS),
                  lambda: checkpoint_tensors(weights, {"source": rows, "target": rows}),
                  dtype or checkpoint_dtype(config))


def freeze_what_the_family_lacks(model, files_dir):
    """Make untrainable each variable of `model` its checkpoint's family has no tensor for (M2M100's output bias).

    Fine-tuned, such a variable would move where the family's checkpoint
    cannot follow, and the run could no longer go back to it (`write_imported`).
    """
    family = family_of(read_config(files_dir))
    for weight in family.weights(model):
        if not weight.names:
            weight.variable.trainable = False


# -- a run trained here, as Marian ---------------------------------------------------------------


def _marian_order(model):
    """The model axis' order that makes the model's sinusoids Marian's (None: they are), or False: none does.

    Marian's are the paper's with every sine first (`marian.POSITIONS`); ours interleave (`blocked_order`).
    """
    choices = sinusoid_choices(model.position)
    if choices is None or choices.get("first_position", 0) != 0 or choices.get("frequency_spacing", "2i/d") != "2i/d":
        return False
    return None if choices.get("columns") == "blocked" else blocked_order


def check_marian(model, source_tokenizer, target_tokenizer):
    """Refuse, in one line, a run that Marian cannot express; nothing is written before this."""
    tokenizers = (source_tokenizer, target_tokenizer)
    if not all(isinstance(tokenizer, SentencePieceTokenizer) for tokenizer in tokenizers):
        raise ValueError("the run's vocabularies are WordPiece, which Marian's tokenizer cannot read: "
                         "train it with --tokenizer sentencepiece")
    if any(marian.PAD in tokenizer.checkpoint_vocab for tokenizer in tokenizers):
        raise ValueError(f"the run's vocabulary has a piece {marian.PAD}, the token Marian's padding needs")
    if source_tokenizer.start_id is not None:
        raise ValueError("the run puts <s> before its sources, which Marian's tokenizer does not "
                         "(a SentencePiece run made before sources were framed as Marian's): train it again")
    positions = model.position if isinstance(model.position, str) else "another table's sinusoidal"
    cannot = [
        (model.norm_first, "pre-LN layers (--norm-first): Marian's are post-LN"),
        (_marian_order(model) is False, f"{positions} positions: Marian's are the paper's sinusoids, from position 0"),
        (model.sliding_window is not None, "local self-attention (sliding_window)"),
        (model.cross_attention_window is not None, "local cross-attention (--cross-attention-window)"),
        (model.activation not in CHECKPOINT_ACTIVATIONS, f"the {model.activation} activation"),
    ]
    for refused, what in cannot:
        if refused:
            raise ValueError(f"Marian cannot express this run's {what}; export it as a SavedModel, CTranslate2 or "
                             "LiteRT model instead")


def write_as_marian(model, source_tokenizer, target_tokenizer, out_dir, decoding, languages=(None, None),
                    dtype="float32"):
    """Write a run trained here (`check_marian` first) into `out_dir` as a Marian checkpoint.

    The vocabularies are ours without our padding id (SentencePiece's pieces,
    in SentencePiece's order), then `<pad>`, which our padding's rows become
    (`weights.VocabularyRows`). Marian has one padding id for both sides: the
    smaller vocabulary gets unused tokens up to the larger, which are never
    generated (`bad_words_ids`). `decoding`: the run's `{"beam_size", "length_alpha"}`;
    `languages`: (source, target) codes for tokenizer_config.json.
    """
    separate = source_tokenizer.checkpoint_vocab != target_tokenizer.checkpoint_vocab or (
        source_tokenizer.model != target_tokenizer.model)
    # Marian has one padding id for both sides: <pad> last on both, after unused tokens on the smaller side.
    size = max(len(source_tokenizer.checkpoint_vocab), len(target_tokenizer.checkpoint_vocab)) + 1
    source_vocab, target_vocab = ([*tokenizer.checkpoint_vocab,
                                   *(f"<unused{index}>" for index in range(size - 1 - len(tokenizer.checkpoint_vocab))),
                                   marian.PAD] for tokenizer in (source_tokenizer, target_tokenizer))
    pad_id = size - 1
    config = marian.checkpoint_config(
        model, (size, size), pad_id=pad_id,
        start_id=target_tokenizer.start_id - ID_OFFSET, end_id=target_tokenizer.end_id - ID_OFFSET, dtype=dtype,
    )
    write_json(os.path.join(out_dir, CONFIG), config)
    write_json(os.path.join(out_dir, GENERATION_CONFIG), {
        key: config[key] for key in ("decoder_start_token_id", "eos_token_id", "pad_token_id")
    } | {
        # max_length counts the decoder's start token: outputs of up to max_length positions, as ours,
        # whose last is not forced to be </s> (no forced_eos_token_id).
        "bad_words_ids": [[index] for index in range(len(target_tokenizer.checkpoint_vocab), size)],
        "max_length": model.max_length + 1, "num_beams": decoding["beam_size"],
        # Hugging Face divides a beam's score by its length ** alpha; ours by GNMT's ((5 + length) / 6) ** alpha.
        "length_penalty": decoding["length_alpha"],
    })
    marian.write_tokenizer(out_dir, (source_vocab, target_vocab), (source_tokenizer.model, target_tokenizer.model),
                           separate, languages, max_length=model.max_length)
    order = _marian_order(model)
    rows = {side: VocabularyRows(padding_kept=True, size=size) for side in ("source", "target")}
    weights = marian.weights(model)
    write_weights(os.path.join(out_dir, SAFETENSORS),
                  lambda: checkpoint_tensors(weights, rows, order(model.d_model) if order else None), dtype)
