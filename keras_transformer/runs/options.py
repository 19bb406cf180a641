"""Every setting of a run: its default, and one table of the options a user can give.

A run's `config.json` has sections (data, tokenizer, model, training,
evaluation) of keys. `DEFAULTS` holds each task's values; `OPTIONS` is the
table the command line is built from: one row per option, saying which
config key it sets, its type, its choices and its help. A new setting is one
default and one row; a new task is one entry in `DEFAULTS` and the rows
it takes.

This module imports nothing heavy: `keras-transformer --help` reads it
without starting TensorFlow. That is also why the few choices that are the
library's names (strategies, precisions, presets, ...) are written out here;
`tests/test_cli.py` checks that they match the library's constants.
"""

import copy
import dataclasses

TRANSLATION = "translation"
CLASSIFICATION = "classification"
PRETRAINING = "pretraining"  # masked-language-model pre-training of a classifier's encoder
LANGUAGE_MODEL = "language_model"  # the decoder alone, GPT-style
TASKS = (TRANSLATION, CLASSIFICATION, PRETRAINING, LANGUAGE_MODEL)

TRANSLATION_DATASETS = ("demo", "multi30k", "files")
# A classifier's corpora; "csv:PATH" names any file with text and label columns.
# The built-in corpora, whose labels are SENTIMENT_LABELS; a classifier also reads any CSV.
SENTIMENT_DATASETS = ("sst2", "imdb", "imdb-sentences")
CLASSIFICATION_DATASETS = (*SENTIMENT_DATASETS, "csv")
# A language model's built-in texts: IMDB's reviews, or one side of Multi30k.
LANGUAGE_MODEL_DATASETS = ("imdb", "multi30k-en", "multi30k-de")
# How a language model's texts become training sequences: packed into full windows, or one text a row.
PACKINGS = ("windows", "lines")
LANGUAGE_MODEL_PRESETS = ("small", "gpt2-small")
# A translation run's vocabularies: learned WordPiece, or SentencePiece (`text.SentencePieceTokenizer.learn`);
# an imported run's config says "pretrained" (its checkpoint's own tokenizers, `runs.translation`).
TOKENIZER_KINDS = ("wordpiece", "sentencepiece")
SENTENCEPIECE_MODEL_TYPES = ("unigram", "bpe")
# Class names of the built-in sentiment sets, for `classify` and the export.
SENTIMENT_LABELS = ("negative", "positive")

# The training settings every task has: where and how precisely it runs, and its seed.
_HOW_TRAINING_RUNS = {
    "strategy": "auto",
    "cpu_replicas": None,
    "cluster_timeout": 300,
    "save_every_steps": None,
    # Keep the last N epochs' weights for `keras-transformer average-checkpoints`.
    "keep_checkpoints": None,
    # "auto": mixed bfloat16 where the chip has native bfloat16, mixed float16
    # on GPUs older than Ampere, float32 elsewhere (training/precision.py).
    "precision": "auto",
    "jit_compile": False,
    # Update the weights once every N batches, with their mean gradient.
    "accumulate_steps": 1,
    "seed": 0,
}

DEFAULTS = {
    TRANSLATION: {
        "task": TRANSLATION,
        "data": {
            "dataset": "demo",
            "data_dir": None,
            "direction": "de-en",  # Multi30k only
            "train_source": None,  # dataset "files": two aligned files or one TSV
            "train_target": None,
            "train_tsv": None,
            "val_source": None,
            "val_target": None,
            "val_tsv": None,
            "limit_train": None,  # use only the first N training pairs
            "limit_val": None,
        },
        # The vocabulary is learned from a seeded sample of at most this many training pairs.
        "tokenizer": {"kind": "wordpiece", "vocab_size": 8000, "shared": False, "lower_case": False,
                      "vocab_sample": 1_000_000, "sentencepiece_model": "unigram", "character_coverage": 1.0},
        "model": {"preset": "small"},  # plus any Transformer argument
        "training": {
            "epochs": 10,
            "max_length": 128,
            "long_pairs": "drop",
            "tokens_per_batch": 4096,
            "batch_size": None,
            "warmup_steps": 4000,
            "learning_rate_scale": 1.0,
            "label_smoothing": 0.1,
            # Validate and keep a moving average of the weights (see classification's).
            "ema_momentum": None,
            "steps_per_epoch": None,
            "early_stopping": None,
            **_HOW_TRAINING_RUNS,
            # TensorBoard: attention maps of this many validation pairs, and the
            # greedy BLEU of this many, after every epoch (0 turns either off).
            "attention_samples": 3,
            "bleu_samples": 200,
            # Start from this run's tokenizers, model and weights (an import-hf run, say).
            "init_from": None,
        },
        "evaluation": {"beam_size": 4, "length_alpha": 0.6, "max_extra_length": 50, "batch_size": 64},
    },
    CLASSIFICATION: {
        "task": CLASSIFICATION,
        "data": {
            "dataset": "sst2",
            "data_dir": None,
            "csv": None,  # dataset csv: a file with text and label columns
            "val_csv": None,
            "val_fraction": 0.1,  # imdb, imdb-sentences and csv without val_csv: held back from train
            "also_train_on": None,  # e.g. "sst2": that corpus's training examples join the training set
            "limit_train": None,
            "limit_val": None,
            "labels": None,  # class names, by label id; default: SENTIMENT_LABELS for SENTIMENT_DATASETS, else "0", "1", ...
        },
        "tokenizer": {"vocab_size": 8000, "lower_case": True},
        "model": {"num_layers": 2, "d_model": 128, "num_heads": 4, "d_ff": 256, "dropout": 0.1, "pooling": "cls"},
        "training": {
            "epochs": 3,
            "max_length": 64,
            "batch_size": 64,
            "warmup_steps": 1000,
            "learning_rate_scale": 1.0,
            "weight_decay": None,  # AdamW's decoupled decay of weight matrices, e.g. 0.1
            # Validate and keep a moving average of the weights (over ~1/(1 - m)
            # steps), e.g. 0.998; None: the weights of the epoch's last step.
            "ema_momentum": None,
            "steps_per_epoch": None,
            "early_stopping": None,
            # The checkpoint kept (and early stopping) follow validation accuracy:
            # a classifier's loss can rise while it gets more examples right.
            "monitor": "val_accuracy",
            **_HOW_TRAINING_RUNS,
            "projector_samples": 500,
            "attention_samples": 3,
            # A pre-training run (`keras-transformer pretrain`) or another
            # classifier's run whose encoder, vocabulary and sizes this classifier starts from.
            "init_from": None,
        },
        "evaluation": {"batch_size": 64},
    },
    PRETRAINING: {
        "task": PRETRAINING,
        "data": {
            "dataset": "sst2",  # the training texts of a classification corpus (labels unused) ...
            "data_dir": None,
            "csv": None,
            "val_csv": None,
            "val_fraction": 0.1,
            "labels": None,
            "text": None,  # ... or a file of texts, one a line
            "limit_train": None,
            "limit_val": None,
        },
        "tokenizer": {"vocab_size": 16000, "lower_case": True},
        # The encoder's sizes, which the classifier started from it takes over.
        "model": {"num_layers": 2, "d_model": 128, "num_heads": 4, "d_ff": 256, "dropout": 0.1},
        "training": {
            "epochs": 10,
            "max_length": 64,
            "batch_size": 64,
            "warmup_steps": 1000,
            "learning_rate_scale": 1.0,
            "mask_rate": 0.15,  # BERT's share of tokens hidden and predicted
            "ema_momentum": None,
            "steps_per_epoch": None,
            "early_stopping": None,
            **_HOW_TRAINING_RUNS,
        },
        "evaluation": {},
    },
    LANGUAGE_MODEL: {
        "task": LANGUAGE_MODEL,
        "data": {
            "dataset": "imdb",
            "data_dir": None,
            "text": None,  # a file (or glob) of texts, one a line, instead of the dataset
            "packing": "windows",
            "limit_train": None,
            "limit_val": None,
        },
        "tokenizer": {"vocab_size": 8000, "lower_case": False},
        "model": {"preset": "small"},  # plus any LanguageModel argument
        "training": {
            "epochs": 3,
            "max_length": 128,  # tokens a sequence (a window) predicts
            "batch_size": 32,
            "warmup_steps": 1000,
            "learning_rate_scale": 1.0,
            "ema_momentum": None,
            "steps_per_epoch": None,
            "early_stopping": None,
            # Prompts (the first words of validation texts) continued greedily each epoch for the Attention tab.
            "attention_samples": 3,
            **_HOW_TRAINING_RUNS,
        },
        "evaluation": {"temperature": 1.0, "top_k": None, "top_p": None, "max_new_tokens": 60},
    },
}

# `--dataset demo`: a corpus and a model small enough to train in a few
# minutes on two CPU cores, in the precision the machine runs fastest.
DEMO = {
    "tokenizer": {"vocab_size": 1000},
    "model": {"preset": None, "num_layers": 2, "d_model": 128, "num_heads": 4, "d_ff": 512, "dropout": 0.1},
    "training": {
        "epochs": 5,
        "max_length": 40,
        "tokens_per_batch": 3072,
        "warmup_steps": 300,
        # Half the schedule's peak: at full height the last epochs jump
        # around (validation accuracy 0.986, 0.972, 0.974 in epochs 4-6) and
        # beam search gets 95.7 BLEU; at half it climbs to 98.2 in 5 epochs.
        "learning_rate_scale": 0.5,
        # Validate and keep the moving average of the last ~100 steps' weights: the
        # last epochs still jump around (validation accuracy 0.979 then 0.976 in
        # epochs 4-5 with seed 1, 94.6 BLEU); the average reaches 99.0 from the same
        # seed (mixed bfloat16, AMD EPYC with AVX-512 BF16, 2026-11-26).
        "ema_momentum": 0.99,
    },
}


@dataclasses.dataclass(frozen=True)
class Option:
    """One command-line option: which config key it sets, and how it reads.

    `type` is int, float, str, or bool for a switch (`--shared-vocab`
    sets True). The flag is `--key-with-dashes` unless `flag` says
    otherwise. An option not given leaves the config's value alone.
    """

    section: str
    key: str
    type: type = str
    help: str = ""
    choices: tuple = None
    flag: str = None
    metavar: str = None
    tasks: tuple = TASKS

    @property
    def flag_name(self):
        return self.flag or "--" + self.key.replace("_", "-")

    @property
    def dest(self):
        return f"{self.section}.{self.key}"


# Rows for one task or two; the others take every task.
_TRANSLATION, _CLASSIFICATION, _PRETRAINING = (TRANSLATION,), (CLASSIFICATION,), (PRETRAINING,)
_LANGUAGE_MODEL = (LANGUAGE_MODEL,)
_TEXT_CORPORA = (CLASSIFICATION, PRETRAINING)

OPTIONS = (
    # data
    Option("data", "dataset", help="the corpus", choices=TRANSLATION_DATASETS, tasks=_TRANSLATION),
    Option("data", "dataset", help=f"{', '.join(SENTIMENT_DATASETS)} (IMDB cut into labelled sentence-length "
           "pieces), or csv:PATH (a file with text and label columns)", tasks=_TEXT_CORPORA),
    Option("data", "val_fraction", float, "the part of imdb, imdb-sentences or a CSV without --val-csv held back "
           "to validate on", tasks=_TEXT_CORPORA),
    Option("data", "also_train_on", help="add these built-in corpora's training examples (comma-separated: "
           f"{', '.join(SENTIMENT_DATASETS)}) to the training set", metavar="NAMES", tasks=_CLASSIFICATION),
    Option("data", "text", help="pre-train on this file's texts, one a line, instead of --dataset's",
           metavar="FILE", tasks=_PRETRAINING),
    Option("data", "dataset", help="the texts", choices=LANGUAGE_MODEL_DATASETS, tasks=_LANGUAGE_MODEL),
    Option("data", "text", help="train on these files' texts, one a line (a glob names several), instead of "
           "--dataset's", metavar="FILES", tasks=_LANGUAGE_MODEL),
    Option("data", "packing", help="windows: texts joined and cut into full windows of --max-length tokens; "
           "lines: one text a row", choices=PACKINGS, tasks=_LANGUAGE_MODEL),
    Option("data", "data_dir", help="the corpus directory (default $KERAS_TRANSFORMER_DATA/NAME or ../shared/data/NAME)"),
    Option("data", "direction", help="Multi30k: de-en or en-de", tasks=_TRANSLATION),
    *(
        Option("data", f"{split}_{kind}", help=f"dataset files: {split} {what} (plain or .gz; a glob names shards)",
               tasks=_TRANSLATION)
        for split in ("train", "val")
        for kind, what in (
            ("source", "source text, one sentence a line"),
            ("target", "target text, aligned with the source"),
            ("tsv", "pairs as source<TAB>target lines"),
        )
    ),
    Option("data", "val_csv", help="csv: the validation file (default: 10%% of the training file held back)",
           tasks=_TEXT_CORPORA),
    Option("data", "limit_train", int, "use only the first N training examples", metavar="N"),
    Option("data", "limit_val", int, "use only the first N validation examples", metavar="N"),
    # tokenizer
    Option("tokenizer", "kind", help="wordpiece (ours), or sentencepiece (the translation toolkits' kind, which "
           "Hugging Face's Marian models read)", choices=TOKENIZER_KINDS, flag="--tokenizer", tasks=_TRANSLATION),
    Option("tokenizer", "vocab_size", int, "vocabulary size"),
    Option("tokenizer", "sentencepiece_model", help="--tokenizer sentencepiece: unigram or bpe",
           choices=SENTENCEPIECE_MODEL_TYPES, tasks=_TRANSLATION),
    Option("tokenizer", "character_coverage", float, "--tokenizer sentencepiece: the share of the text's characters "
           "the vocabulary knows, 0.98 to 1.0 (0.9995 for Chinese or Japanese)", tasks=_TRANSLATION),
    Option("tokenizer", "shared", bool, "one vocabulary for both languages", flag="--shared-vocab", tasks=_TRANSLATION),
    Option("tokenizer", "lower_case", bool, "lowercase all text", tasks=_TRANSLATION),
    Option("tokenizer", "vocab_sample", int, "learn the vocabulary from a seeded sample of at most N training "
           "pairs", metavar="N", tasks=_TRANSLATION),
    # model
    Option("model", "preset", help="small, or GPT-2's smallest sizes", choices=LANGUAGE_MODEL_PRESETS,
           tasks=_LANGUAGE_MODEL),
    Option("model", "preset", help="the paper's sizes (Table 3), and small", choices=("small", "base", "big"),
           tasks=_TRANSLATION),
    Option("model", "num_layers", int, "layers in the encoder (and the decoder)"),
    Option("model", "d_model", int, "the model's width"),
    Option("model", "num_heads", int, "attention heads"),
    Option("model", "d_ff", int, "the feed-forward layers' width"),
    Option("model", "dropout", float, "dropout rate"),
    # layers.embedding.POSITION_KINDS (not imported: the command line starts without Keras; test_cli compares).
    Option("model", "position", help="sinusoidal (the paper's) or learned positions", choices=("sinusoidal", "learned"),
           tasks=_TRANSLATION),
    Option("model", "share_embeddings", bool, "one embedding for source and target (needs --shared-vocab)",
           tasks=_TRANSLATION),
    Option("model", "tie_output", bool, "the output layer reuses the target embedding", tasks=_TRANSLATION),
    Option("model", "norm_first", bool, "LayerNorm before each sub-layer (pre-norm)", tasks=_TRANSLATION),
    Option("model", "cross_attention_window", int, "local cross-attention: each target position sees the "
           "2D+1 source positions around one it predicts, Gaussian-weighted (Luong et al.'s local-p)",
           metavar="D", tasks=_TRANSLATION),
    Option("model", "pooling", help="what the head sees: [CLS], the mean, or a learned weight per token",
           choices=("cls", "mean", "attention"), tasks=_CLASSIFICATION),
    # training
    Option("training", "epochs", int, "epochs to train (more than a finished run's, to train it further)"),
    Option("training", "max_length", int, "tokens per sentence at most"),
    Option("training", "long_pairs", help="what happens to longer pairs", choices=("drop", "truncate"),
           tasks=_TRANSLATION),
    Option("training", "tokens_per_batch", int, "batch by length under this token budget", tasks=_TRANSLATION),
    Option("training", "batch_size", int, "sentences per batch (translation: instead of a token budget)"),
    Option("training", "warmup_steps", int, "steps of learning-rate warm-up (weight updates)"),
    Option("training", "accumulate_steps", int, "update the weights once every K batches, with their mean "
           "gradient: K batches of B tokens train as one of K x B (the schedule counts updates)", metavar="K"),
    Option("training", "learning_rate_scale", float, "multiplies the schedule's learning rate"),
    Option("training", "label_smoothing", float, "label smoothing of the loss", tasks=_TRANSLATION),
    Option("training", "ema_momentum", float, "validate and keep a moving average of the weights over about "
           "1/(1-M) steps, e.g. 0.999 (the paper averages its last checkpoints instead)", metavar="M"),
    Option("training", "steps_per_epoch", int, "steps per epoch (default: one pass over the data)"),
    Option("training", "early_stopping", int, "stop after this many epochs without improvement", metavar="PATIENCE"),
    Option("training", "strategy", help="how training is distributed (auto: multi-worker when TF_CONFIG names "
           "a cluster, else mirrored over several GPUs)", choices=("auto", "mirrored", "multi-worker", "none")),
    Option("training", "cpu_replicas", int, "split the CPU into N devices for MirroredStrategy", metavar="N"),
    Option("training", "cluster_timeout", int, "seconds a worker waits for the rest of its cluster", metavar="SECONDS"),
    Option("training", "save_every_steps", int, "back the training state up every N steps too, not only after "
           "each epoch (a kill loses at most N steps)", metavar="N"),
    Option("training", "keep_checkpoints", int, "keep the last N epochs' weights too, for "
           "`keras-transformer average-checkpoints` (the paper averages its last 5)", metavar="N"),
    Option("training", "precision", help="auto (the default: mixed bfloat16 where the CPU or GPU has fast bfloat16, "
           "mixed float16 on GPUs older than Ampere, else float32), float32, or a mixed precision",
           choices=("auto", "float32", "mixed_float16", "mixed_bfloat16")),
    Option("training", "jit_compile", bool, "compile the training step with XLA", tasks=_TRANSLATION),
    Option("training", "seed", int, "the seed of every random choice"),
    Option("training", "attention_samples", int, "validation examples whose attention goes to TensorBoard",
           tasks=(TRANSLATION, CLASSIFICATION, LANGUAGE_MODEL)),
    Option("training", "bleu_samples", int, "validation pairs for the per-epoch BLEU in TensorBoard",
           tasks=_TRANSLATION),
    Option("training", "projector_samples", int, "validation texts whose [CLS] embeddings go to TensorBoard",
           tasks=_CLASSIFICATION),
    Option("training", "init_from", help="start the encoder from this pre-training run (`keras-transformer "
           "pretrain`) or classifier run: its vocabulary, sizes and weights", metavar="RUN_DIR", flag="--init-from",
           tasks=_CLASSIFICATION),
    Option("training", "init_from", help="fine-tune this run's model (a pretrained checkpoint imported with "
           "`keras-transformer import-hf`, or a translation run): its tokenizers, sizes, decoding and weights",
           metavar="RUN_DIR", flag="--init-from", tasks=_TRANSLATION),
    Option("training", "mask_rate", float, "the share of tokens hidden and predicted", tasks=_PRETRAINING),
    # evaluation
    Option("evaluation", "beam_size", int, "beam size when this run translates (1: greedy)", tasks=_TRANSLATION),
)


def options_for(task):
    return [option for option in OPTIONS if task in option.tasks]


def default_of(option, task, demo=False):
    """The value a run of `task` takes when `option` is not given (with `demo`: the demo's)."""
    defaults = merge_config(DEFAULTS[task], DEMO) if demo else DEFAULTS[task]
    return defaults.get(option.section, {}).get(option.key)


def config_from_options(task, given):
    """The config overrides for `task` from `{dest: value}` of the options given (None: not given).

    `--dataset demo` (translation's default) brings the demo's settings,
    under anything given explicitly.
    """
    config = {}
    for option in options_for(task):
        value = given.get(option.dest)
        if value is not None:
            config.setdefault(option.section, {})[option.key] = value
    if task == TRANSLATION and config.get("data", {}).get("dataset", DEFAULTS[task]["data"]["dataset"]) == "demo":
        config = merge_config(DEMO, config)
    return config


def merge_config(base, overrides):
    """Nested dict update that returns a new dict."""
    merged = copy.deepcopy(base)
    for key, value in (overrides or {}).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_config(merged[key], value)
        else:
            merged[key] = value
    return merged
