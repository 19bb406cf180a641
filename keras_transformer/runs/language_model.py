"""Language-model runs: what `keras-transformer train-lm`, `generate` and `evaluate` do for the decoder alone.

    texts (data) -> WordPiece vocabulary (text) -> "[START] pieces [END]" per text
      -> packed into windows (or one text a row) -> LanguageModel (models) -> model.fit -> model.keras
      -> sampling on the key/value cache (inference.sample) -> text

The texts are files' lines (`--text FILES`) or a built-in corpus: IMDB's
training reviews, or one side of Multi30k. One text in 50 (at most 1000) is
held back to validate on. Every position predicts the next token; the loss
and perplexity skip padding.
"""

import functools
import gzip
import logging
import math
import random

import numpy as np
import tensorflow as tf

from keras_transformer import data, inference, models, text
from keras_transformer.lines import valid_text
from keras_transformer.runs import fitting
from keras_transformer.runs import run_dir as runs
from keras_transformer.runs.options import DEFAULTS, LANGUAGE_MODEL, LANGUAGE_MODEL_DATASETS, PACKINGS

logger = logging.getLogger("keras_transformer")

# -- texts and batches -------------------------------------------------------------


def load_texts(data_config):
    """`{"train": [text, ...], "val": [...]}`: one text in 50 (at most 1000) held back to validate on."""
    dataset = data_config["dataset"]
    if data_config.get("text"):
        texts, origin = text_lines(data_config["text"]), data_config["text"]
    elif dataset == "imdb":
        reviews = data.load_imdb(data_config["data_dir"])
        texts = [review for split in ("train", "val") for review, _ in reviews[split]]
        origin = "IMDB's training reviews"
    elif dataset in LANGUAGE_MODEL_DATASETS:
        language = dataset.split("-")[1]
        pairs = data.load_multi30k(data_config["data_dir"], direction=f"{language}-{'de' if language == 'en' else 'en'}",
                                   splits=("train",))["train"]
        texts = [source for source, _ in pairs]
        origin = f"Multi30k's {language} side"
    else:
        raise ValueError(f"dataset must be one of {LANGUAGE_MODEL_DATASETS}, or give --text; got {dataset!r}")
    if len(texts) < 2:
        raise ValueError(f"{origin} needs at least two non-empty texts to train a language model on")
    random.Random(0).shuffle(texts)
    held = max(1, min(1000, len(texts) // 50))
    splits = {"val": texts[:held], "train": texts[held:]}
    for split in ("train", "val"):
        limit = data_config.get(f"limit_{split}")
        if limit:
            splits[split] = splits[split][:limit]
    return splits


def text_lines(pattern):
    """The non-empty lines of the files a glob names (plain or .gz), stripped; one line naming a file that is not UTF-8."""
    lines = []
    for path in data.streaming.expand(pattern):
        opener = gzip.open if path.endswith(".gz") else open
        try:
            with opener(path, "rt", encoding="utf-8") as file:
                lines += [line.strip() for line in file if line.strip()]
        except (UnicodeDecodeError, OSError, EOFError) as error:
            raise data.CorpusError(f"{path} cannot be read as UTF-8 text ({error})") from None
    return lines


def make_batches(texts, tokenizer, max_length, batch_size, packing="windows", shuffle=False, seed=0):
    """`(dataset of (inputs, labels), epoch variable)`: each position's label is the next token.

    Each text is `[START] pieces [END]`. "windows" joins them into one stream
    cut into windows of `max_length + 1` tokens (no padding: every position
    learns; the last, partial window is dropped); "lines" makes a row of each
    text, cut to `max_length + 1` tokens and padded with 0, which the loss skips.
    """
    if packing not in PACKINGS:
        raise ValueError(f"packing must be one of {PACKINGS}, got {packing!r}")
    ids = tf.data.Dataset.from_tensor_slices(tf.constant(texts, tf.string)).batch(1024).map(tokenizer.tokenize)
    if packing == "windows":
        stream = ids.map(lambda batch: batch.flat_values).unbatch()
        rows = stream.batch(max_length + 1, drop_remainder=True)
    else:
        rows = ids.unbatch().map(lambda row: row[: max_length + 1])
    rows = rows.cache()
    count = sum(1 for _ in rows)
    if count == 0:
        raise ValueError(f"the texts make no window of {max_length + 1} tokens: give more text or a smaller --max-length")
    epoch = None
    if shuffle:
        rows, epoch = data.shuffle_each_epoch(rows, count, seed)
    batches = rows.padded_batch(batch_size, padded_shapes=[None]).map(lambda row: (row[:, :-1], row[:, 1:]))
    batches = batches.apply(tf.data.experimental.assert_cardinality(-(-count // batch_size)))
    return batches.prefetch(tf.data.AUTOTUNE), epoch


def tokenizer(run_dir, tokenizer_config, train_texts=None):
    """The run's vocabulary: loaded, or learned from `train_texts` and saved."""
    return runs.learn_or_load_tokenizer(
        run_dir, "", train_texts or [], tokenizer_config["vocab_size"], tokenizer_config["lower_case"]
    )


# -- model ---------------------------------------------------------------------------


def build_model(config, vocab_size):
    """The run's LanguageModel, built (weights made), not trained."""
    model_config = config["model"]
    arguments = {key: value for key, value in model_config.items() if key != "preset"}
    # Windows of max_length + 1 tokens: the inputs are max_length long.
    arguments.update(vocab_size=vocab_size, max_length=config["training"]["max_length"])
    if model_config.get("preset"):
        model = models.LanguageModel.from_preset(model_config["preset"], **arguments)
    else:
        model = models.LanguageModel(**arguments)
    model.build((None, None))
    return model


def compile_model(model, config):
    # No label smoothing: a language model's probabilities are what it is
    # judged by (perplexity) and what it samples from.
    runs.compile_token_prediction(model, model.d_model, config["training"], label_smoothing=0.0)


# -- the commands ------------------------------------------------------------------


def train(config, run_dir, verbose=1, overwrite=False):
    """Train, resume or continue a language model in `run_dir` (rules: `run_dir.start`); returns the metrics."""
    with runs.written_by_this_process(run_dir) as writable_run_dir:
        return _train(config, writable_run_dir, verbose, overwrite)


def _train(config, run_dir, verbose, overwrite):
    config, strategy, state = runs.start(run_dir, config, DEFAULTS[LANGUAGE_MODEL], overwrite)
    settings = config["training"]
    if state.finished:
        return runs.nothing_to_train(run_dir, state)
    texts = load_texts(config["data"])
    text_tokenizer = tokenizer(run_dir, config["tokenizer"], texts["train"])
    batching = dict(max_length=settings["max_length"], batch_size=settings["batch_size"],
                    packing=config["data"]["packing"])
    train_batches, train_epoch = make_batches(texts["train"], text_tokenizer, shuffle=True, seed=settings["seed"],
                                              **batching)
    val_batches, _ = make_batches(texts["val"], text_tokenizer, **batching)
    with strategy.scope():
        model = build_model(config, text_tokenizer.vocab_size)
        compile_model(model, config)
    logger.info("language model: %d parameters, %d texts", model.count_params(), len(texts["train"]))
    metrics = fitting.fit_epochs(model, run_dir, state, settings, (train_batches, val_batches, train_epoch),
                              _attention_callbacks(run_dir, settings, texts["val"], text_tokenizer), verbose)
    metrics.update(train_texts=len(texts["train"]), replicas=strategy.num_replicas_in_sync)
    return runs.update_metrics(run_dir, {"training": metrics})


# The words of a validation text that make a prompt for the Attention tab.
PROMPT_WORDS = 6


def _attention_callbacks(run_dir, settings, val_texts, text_tokenizer):
    from keras_transformer.tensorboard_loggers import LanguageModelAttentionLogger, attention_samples

    watched = attention_samples(val_texts, settings["attention_samples"])
    if not watched:
        return []
    prompts = [" ".join(text.split()[:PROMPT_WORDS]) for text in watched]
    return [LanguageModelAttentionLogger(prompts, text_tokenizer, runs.log_path(run_dir, "samples"))]


def load_config(run_dir):
    return runs.load_config(run_dir, DEFAULTS[LANGUAGE_MODEL])


def load(run_dir):
    """`(model, tokenizer)` of a trained run."""
    config = load_config(run_dir)
    text_tokenizer = text.WordPieceTokenizer.load(runs.vocab_path(run_dir))
    model = runs.load_trained_model(run_dir, lambda: build_model(config, text_tokenizer.vocab_size))
    return model, text_tokenizer


def load_generator(run_dir, temperature=None, top_k=None, top_p=None, max_new_tokens=None):
    """The run's `inference.Generator`, with the run's sampling settings unless others are given."""
    settings = load_config(run_dir)["evaluation"]
    model, text_tokenizer = load(run_dir)
    chosen = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "max_new_tokens": max_new_tokens}
    chosen = {name: settings[name] if value is None else value for name, value in chosen.items()}
    # By default, at most half the model's window: the prompt keeps the other half.
    if max_new_tokens is None:
        chosen["max_new_tokens"] = min(chosen["max_new_tokens"], model.max_length // 2)
    return inference.Generator(
        model, text_tokenizer, temperature=chosen["temperature"], top_k=chosen["top_k"] or 0,
        top_p=1.0 if chosen["top_p"] is None else chosen["top_p"], max_new_tokens=chosen["max_new_tokens"],
    )


def export_litert(run_dir, out_dir, quantization=None, ops="text", web=False):
    """Write the run's generator as a LiteRT file in the new directory `out_dir` (`export.litert`); returns it.

    `web`: a page around a builtin file, which continues texts offline in a browser (`export.web`).
    """
    from keras_transformer.export import litert, web as pages

    litert.check_request(out_dir, quantization, ops)  # before the model is loaded
    held_out = {"text": runs.held_out_texts(lambda: load_texts(load_config(run_dir)["data"])["val"])}
    service = litert.LiteRTGeneration(load_generator(run_dir), ops, fixed_rows=1 if web else None)
    if web:
        return pages.export_web(service, out_dir, quantization, held_out)
    return litert.export_litert(service, out_dir, quantization, held_out)


export_web = functools.partial(export_litert, ops="builtin", web=True)  # `export --format web`


def generate(run_dir, prompts, seed=0, temperature=None, top_k=None, top_p=None, max_new_tokens=None):
    """Continue each prompt with sampled text (settings default to the run's); returns the whole texts.

    A blank prompt is continued from nothing: the model's own first words.
    """
    generator = load_generator(run_dir, temperature, top_k, top_p, max_new_tokens)
    prompts = [valid_text(prompt)[0] for prompt in prompts]
    texts = generator(tf.constant(prompts, tf.string), seed=seed)["text"]
    return [value.decode("utf-8") for value in texts.numpy()]


def plot_attention(run_dir, prompt, png=None, html=None, layer=None, heads=None, seed=0):
    """Continue `prompt` (the run's settings); save one layer's self-attention as `png`, every layer's in `html`.

    Returns the text. The maps are over the whole text, prompt and
    continuation (`Generator.attention_scores`); the HTML file is the
    explorer of TensorBoard's Attention tab, self-contained.
    """
    from keras_transformer.models.attention_maps import DECODER_SELF, TEXT_SIDE, attention_map_name

    generator = load_generator(run_dir)
    num_layers = generator.model.num_layers
    layer = num_layers - 1 if layer is None else layer
    if not 0 <= layer < num_layers:
        raise ValueError(f"layer must be between 0 and {num_layers - 1}, got {layer}")
    (result,) = generator.attention_maps([prompt], seed=seed)
    tokens = result["tokens"]
    if png:
        from keras_transformer.visualization import plot_attention as plot

        figure = plot(result["attention"][attention_map_name(DECODER_SELF, layer)], tokens, tokens, heads=heads,
                      title=f"self-attention, layer {layer}: {result['text']}")
        figure.savefig(png)
    if html:
        from keras_transformer.visualization import write_explorer

        maps = [(DECODER_SELF, index, TEXT_SIDE, TEXT_SIDE, result["attention"][attention_map_name(DECODER_SELF, index)])
                for index in range(num_layers)]
        write_explorer(html, {"prompt": prompt, "text": result["text"]}, {TEXT_SIDE: tokens}, maps,
                       title=f"Attention: {prompt}", run="text")
    return result["text"]


def describe_saved_model(path):
    """What `export` tells the user of a language model's export: its signatures."""
    return ["signatures: serving_default (text -> text, continuation, new_tokens), "
            "generate (text, seed, temperature, top_k, top_p, max_new_tokens -> the same)"]


def export(run_dir, export_base, version=None):
    """Write the run's generator (its sampling settings) as `export_base/<version>/` for TensorFlow Serving."""
    from keras_transformer.export import export_language_model, version_path

    version_path(export_base, version)  # a taken version fails before the model is loaded
    return export_language_model(load_generator(run_dir), export_base, version=version)


def evaluate(run_dir, text_file=None, batch_size=32):
    """Per-token perplexity and bits per character on the run's validation texts (or a file's lines).

    Each text is scored on its own, `[START]` given: every following token
    (the pieces and [END]) is predicted, with the tokens before it in the
    text as context; a text longer than the model's window is scored in
    consecutive windows that overlap by one token. Bits per character are the
    total of -log2 p over the text's characters (one more for its end), which
    compares models whatever their vocabularies.
    """
    config = load_config(run_dir)
    if text_file:
        texts = text_lines(text_file)
        if not texts:
            raise ValueError(f"{text_file} has no text to evaluate on")
    else:
        texts = load_texts(config["data"])["val"]
    model, text_tokenizer = load(run_dir)
    window = model.max_length + 1
    rows = []
    for ids in text_tokenizer.tokenize(tf.constant(texts, tf.string)).to_list():
        for start in range(0, max(1, len(ids) - 1), window - 1):
            rows.append(ids[start : start + window])
    total_nats, tokens = 0.0, 0
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        width = max(len(row) for row in chunk)
        padded = np.array([row + [0] * (width - len(row)) for row in chunk], "int32")
        logits = model(padded[:, :-1])
        log_probs = tf.nn.log_softmax(tf.convert_to_tensor(logits), axis=-1).numpy()
        labels = padded[:, 1:]
        picked = np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
        real = labels != 0
        total_nats -= float(picked[real].sum())
        tokens += int(real.sum())
    characters = sum(len(line) + 1 for line in texts)
    scores = {
        "perplexity": round(math.exp(total_nats / tokens), 3),
        "bits_per_character": round(total_nats / math.log(2) / characters, 4),
        "tokens": tokens,
        "characters": characters,
        "texts": len(texts),
        "data": text_file or "validation texts",
    }
    runs.update_metrics(run_dir, {"evaluation": scores})
    return scores


__all__ = ["build_model", "evaluate", "export", "generate", "load", "load_config", "load_generator",
           "plot_attention", "load_texts", "make_batches", "train"]
