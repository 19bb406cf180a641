"""TensorBoard loggers: callbacks that show what a model learns (`training.callbacks` holds training's own).

`AttentionMapLogger` writes, at the end of an epoch, for a few fixed
validation pairs: a heatmap grid per layer (one panel per head) of the
encoder self-attention, the decoder self-attention and the cross-attention
of the model's current greedy translation, labelled with the tokens; a text
summary with the source, the reference and that translation; and the
validation BLEU on a larger sample as a scalar; and the attention weights
themselves, which the Attention tab draws (`keras_transformer.tensorboard_plugin`:
point at a word, compare heads, step through the epochs). Open them with
`tensorboard --logdir RUN_DIR/logs` (Attention, Images, Text and Scalars tabs).

`LanguageModelAttentionLogger` does the same for a language model: a few
prompts continued greedily each epoch, with every layer's self-attention
over the whole text, for the Attention tab.

`EmbeddingProjectorLogger` watches a classifier: each epoch it writes the
pooled ([CLS]) sentence embeddings of a fixed validation sample for
TensorBoard's Projector tab (with a metadata table of label and text) and a
2-D projection (PCA; t-SNE as well when scikit-learn is installed) as an
image, so the classes can be seen separating epoch by epoch.
"""

from keras_transformer.backends import require_tensorflow

require_tensorflow("keras_transformer.tensorboard_loggers", "TensorBoard summaries of TensorFlow decoding")

import os

import keras
import numpy as np
import tensorflow as tf

from keras_transformer.evaluation import translation_scores
from keras_transformer.inference import DecodingSettings, Generator, Translator
from keras_transformer.models.attention_maps import (
    CLS_ROW,
    CLS_ROW_SIDES,
    DECODER_SELF,
    ENCODER,
    ENCODER_STACK,
    KINDS,
    POOLING,
    POOLING_QUERY,
    POOLING_SIDES,
    SOURCE,
    TARGET,
    TEXT_SIDE,
    attention_map_name,
    parse_attention_map_name,
    maps_with_sides,
    queries_and_keys,
    stack_attention_maps,
)
from keras_transformer.tensorboard_plugin.summaries import write_sample
from keras_transformer.visualization import figure_to_png, plot_attention


class AttentionMapLogger(keras.callbacks.Callback):
    """Attention maps, sample translations and BLEU in TensorBoard, every few epochs.

    Every logged epoch writes the samples' attention weights (the Attention
    tab), their translations and the greedy BLEU; the heatmap grids of the
    Images tab are drawn at the end of training only, unless
    `image_every_n_epochs` asks for more: drawing them (one matplotlib figure
    per sample, layer and kind) took 40 of a Multi30k epoch's 150 s.

    Args:
        samples: `(source, reference)` pairs whose attention is drawn (a few:
            each gives one image per layer and kind).
        log_dir: where to write (a `samples` folder of the TensorBoard log
            directory, say).
        source_tokenizer, target_tokenizer: the run's `WordPieceTokenizer`s.
        bleu_pairs: `(source, reference)` pairs for the validation BLEU scalar
            (greedy decoding); none: no BLEU.
        every_n_epochs: log after every n-th epoch (and after the last).
        image_every_n_epochs: also draw the heatmap grids after every n-th
            epoch; None: after the last logged epoch only.
        layers, heads: which layers and heads to draw (default all).
        kinds: which maps: any of "encoder", "decoder_self", "cross".

    Example:
    >>> logger = AttentionMapLogger(val_pairs[:3], "runs/demo/logs/samples",
    ...                             source_tokenizer, target_tokenizer, bleu_pairs=val_pairs[:200])
    >>> model.fit(train, validation_data=val, epochs=10, callbacks=[logger])
    """

    def __init__(
        self,
        samples,
        log_dir,
        source_tokenizer,
        target_tokenizer,
        bleu_pairs=None,
        every_n_epochs=1,
        layers=None,
        heads=None,
        kinds=KINDS,
        image_every_n_epochs=None,
    ):
        super().__init__()
        self.samples = [(str(source), str(reference)) for source, reference in samples]
        if not self.samples:
            raise ValueError("AttentionMapLogger needs at least one (source, reference) sample")
        for name, value in (("every_n_epochs", every_n_epochs), ("image_every_n_epochs", image_every_n_epochs or 1)):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown attention kinds {sorted(unknown)}; choose from {list(KINDS)}")
        self.log_dir = log_dir
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer
        self.bleu_pairs = list(bleu_pairs or [])
        self.every_n_epochs = every_n_epochs
        self.image_every_n_epochs = image_every_n_epochs
        self.layers = None if layers is None else set(layers)
        self.heads = heads
        self.kinds = tuple(kinds)
        self._translator = None
        self._writer = None
        self._undrawn = None  # (step, results) of the last logged epoch, until its images are drawn

    def _ensure_ready(self):
        if self._translator is None:
            # Greedy: it is what the model "thinks" now, and it is cheap.
            self._translator = Translator(self.model, self.source_tokenizer, self.target_tokenizer,
                                          DecodingSettings(beam_size=1))
            self._writer = tf.summary.create_file_writer(self.log_dir)

    def on_epoch_end(self, epoch, logs=None):
        last = self.params.get("epochs") if self.params else None
        if (epoch + 1) % self.every_n_epochs == 0 or (last is not None and epoch + 1 == last):
            images = self.image_every_n_epochs is not None and (epoch + 1) % self.image_every_n_epochs == 0
            self.log(step=epoch + 1, images=images)

    def on_train_end(self, logs=None):
        # Training may end before its last epoch (early stopping): draw the last logged one now.
        if self._undrawn is not None:
            step, results = self._undrawn
            with self._writer.as_default(step=step):
                self._draw_images(results)
            self._undrawn = None
        if self._writer is not None:
            self._writer.flush()

    def log(self, step, images=True):
        """Write the attention weights, texts and BLEU (and with `images` the heatmaps) for epoch `step`."""
        self._ensure_ready()
        results = self._translator.attention_maps([source for source, _ in self.samples])
        with self._writer.as_default(step=step):
            for index, ((source, reference), result) in enumerate(zip(self.samples, results)):
                self._log_sample(index, source, reference, result)
            if images:
                self._draw_images(results)
            if self.bleu_pairs:
                sources, references = zip(*self.bleu_pairs)
                hypotheses = self._translator.translate(sources)
                scores = translation_scores(hypotheses, references)
                tf.summary.scalar("val_bleu", scores["bleu"])
                tf.summary.scalar("val_chrf", scores["chrf"])
        self._writer.flush()
        self._undrawn = None if images else (step, results)

    def _chosen_maps(self, result):
        return [
            (kind, layer, queries, keys, attention)
            for kind, layer, queries, keys, attention in maps_with_sides(result["attention"])
            if kind in self.kinds and (self.layers is None or layer in self.layers)
        ]

    def _log_sample(self, index, source, reference, result):
        tf.summary.text(
            f"sample_{index}/translation",
            f"| | |\n|---|---|\n| source | {source} |\n| reference | {reference} |\n"
            f"| model (greedy) | {result['translation']} |",
        )
        # The weights themselves, for the Attention tab (every head: the page chooses).
        write_sample(
            index,
            {"source": source, "reference": reference, "translation": result["translation"]},
            {SOURCE: result["source_tokens"], TARGET: result["target_tokens"]},
            self._chosen_maps(result),
        )

    def _draw_images(self, results):
        for index, result in enumerate(results):
            for kind, layer, _, _, attention in self._chosen_maps(result):
                queries, keys = queries_and_keys(kind, result["source_tokens"], result["target_tokens"])
                figure = plot_attention(
                    attention, queries, keys, heads=self.heads, title=f"sample {index}: {kind} attention, layer {layer}"
                )
                image = tf.io.decode_png(figure_to_png(figure), channels=4)
                tf.summary.image(f"sample_{index}/{kind}/layer_{layer}", image[None], step=None)


def attention_samples(pairs, count=3):
    """`count` validation pairs spread over `pairs` (deterministic)."""
    pairs = list(pairs)
    if not pairs:
        return []
    positions = np.linspace(0, len(pairs) - 1, num=min(count, len(pairs))).astype(int)
    return [pairs[position] for position in positions]


def pca_2d(embeddings):
    """The embeddings projected on their two principal axes: `(n, 2)`."""
    centred = embeddings - embeddings.mean(axis=0, keepdims=True)
    # The right singular vectors are the principal axes.
    _, _, axes = np.linalg.svd(centred, full_matrices=False)
    return centred @ axes[:2].T


def _scatter_png(points, labels, title):
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5, 4.5), dpi=100, layout="constrained")
    axis = figure.subplots()
    for label in sorted(set(labels.tolist())):
        chosen = labels == label
        axis.scatter(points[chosen, 0], points[chosen, 1], s=8, alpha=0.7, label=f"label {label}")
    axis.set_title(title, fontsize=10)
    axis.legend(fontsize=8)
    return figure_to_png(figure)


class EmbeddingProjectorLogger(keras.callbacks.Callback):
    """Sentence embeddings of a fixed sample, for the Projector tab and as a 2-D picture, every epoch.

    Args:
        token_ids: `(n, length)` ids of the sample (as the model is fed).
        labels: `(n,)` integer labels, to colour the points.
        texts: the `n` sentences, for the projector's metadata.
        log_dir: where to write (`RUN_DIR/logs/embeddings`, say).
        embed: a function from ids to `(n, d)` embeddings; default the
            model's `embed` (`TransformerClassifier`: the pooled [CLS] state).
        every_n_epochs: log after every n-th epoch (and after the last).
        image_every_n_epochs: also draw the heatmap grids after every n-th
            epoch; None: after the last logged epoch only.
        tsne: also draw a t-SNE projection ("auto": when scikit-learn is installed).

    The projector reads the newest `embeddings.ckpt` in `log_dir`; the images
    (`embeddings/pca`, `embeddings/tsne`) keep one step per epoch.
    """

    def __init__(self, token_ids, labels, texts, log_dir, embed=None, every_n_epochs=1, tsne="auto"):
        super().__init__()
        self.token_ids = np.asarray(token_ids)
        self.labels = np.asarray(labels).astype(int)
        self.texts = [str(text) for text in texts]
        if not (len(self.token_ids) == len(self.labels) == len(self.texts)) or len(self.texts) < 3:
            raise ValueError(
                f"token_ids, labels and texts must describe the same sample of at least 3 sentences; "
                f"got {len(self.token_ids)}, {len(self.labels)} and {len(self.texts)}"
            )
        if every_n_epochs < 1:
            raise ValueError(f"every_n_epochs must be at least 1, got {every_n_epochs}")
        self.log_dir = log_dir
        self.embed = embed
        self.every_n_epochs = every_n_epochs
        self.tsne = tsne
        self._writer = None

    def on_epoch_end(self, epoch, logs=None):
        last = self.params.get("epochs") if self.params else None
        if (epoch + 1) % self.every_n_epochs == 0 or (last is not None and epoch + 1 == last):
            self.log(step=epoch + 1)

    def _embeddings(self):
        embed = self.embed or self.model.embed
        batches = [
            keras.ops.convert_to_numpy(embed(self.token_ids[start : start + 256], training=False))
            for start in range(0, len(self.token_ids), 256)
        ]
        return np.concatenate(batches).astype(np.float32)

    def log(self, step):
        from tensorboard.plugins import projector

        os.makedirs(self.log_dir, exist_ok=True)
        embeddings = self._embeddings()
        # The projector's metadata: a header, then one row per point.
        with open(os.path.join(self.log_dir, "metadata.tsv"), "w", encoding="utf-8") as file:
            file.write("label\ttext\n")
            for label, text in zip(self.labels, self.texts):
                file.write(f"{label}\t{' '.join(text.split())[:200]}\n")
        variable = tf.Variable(embeddings, name="sentence_embeddings")
        checkpoint = tf.train.Checkpoint(sentence_embeddings=variable)
        checkpoint.write(os.path.join(self.log_dir, "embeddings.ckpt"))
        config = projector.ProjectorConfig()
        entry = config.embeddings.add()
        entry.tensor_name = "sentence_embeddings/.ATTRIBUTES/VARIABLE_VALUE"
        entry.metadata_path = "metadata.tsv"
        projector.visualize_embeddings(self.log_dir, config)

        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        images = {"pca": (pca_2d(embeddings), "PCA")}
        if self.tsne is True or (self.tsne == "auto" and _has_sklearn()):
            from sklearn.manifold import TSNE

            perplexity = min(30.0, (len(embeddings) - 1) / 3)
            images["tsne"] = (TSNE(perplexity=perplexity, random_state=0).fit_transform(embeddings), "t-SNE")
        with self._writer.as_default(step=step):
            for name, (points, method) in images.items():
                png = _scatter_png(points, self.labels, f"{method} of sentence embeddings, epoch {step}")
                tf.summary.image(f"embeddings/{name}", tf.io.decode_png(png, channels=4)[None])
        self._writer.flush()


class ClassifierAttentionLogger(keras.callbacks.Callback):
    """What a classifier read its label from, over a few sentences, for the Attention tab, every epoch.

    With "cls" pooling, the label is read from the final state of [CLS], and
    [CLS] gathers the sentence through its row of each layer's
    self-attention: that row shows which words the label was made of (kind
    `CLS_ROW`, every layer and head). With "attention" pooling, the pooling's
    own weights say it directly (kind `POOLING`, one map). For each sentence
    and epoch this writes those maps, the sentence's tokens, its label and the
    model's prediction (`keras_transformer.tensorboard_plugin.summaries`).

    Args:
        token_ids: `(n, length)` ids of the sentences as the model is fed
            ([CLS] first, padding 0).
        texts, labels: the sentences and their integer labels.
        tokenizer: the run's `WordPieceTokenizer` (for the tokens' strings).
        log_dir: where to write (`RUN_DIR/logs/samples`, say).
        class_names: label names; default the label numbers.

    Example:
    >>> ids = tokenizer.tokenize_with_cls(tf.constant(texts), 128).numpy()
    >>> model.fit(..., callbacks=[ClassifierAttentionLogger(ids, texts, labels, tokenizer, "run/logs/samples")])
    """

    # The poolings whose label has a map to show (mean pooling gives every token the same say).
    POOLINGS = ("cls", "attention")

    def __init__(self, token_ids, texts, labels, tokenizer, log_dir, class_names=None):
        super().__init__()
        self.token_ids = np.asarray(token_ids)
        self.texts = [str(text) for text in texts]
        self.labels = [int(label) for label in labels]
        if not len(self.token_ids) == len(self.texts) == len(self.labels) or not self.texts:
            raise ValueError("token_ids, texts and labels must describe the same (non-empty) sentences")
        self.tokenizer = tokenizer
        self.log_dir = log_dir
        self.class_names = list(class_names) if class_names else None
        self._writer = None

    def on_epoch_end(self, epoch, logs=None):
        self.log(step=epoch + 1)

    def _name(self, label):
        return self.class_names[label] if self.class_names else str(label)

    def _maps(self):
        """`[(kind, layer, query side, key side, (n, heads, queries, length)), ...]` for the model's pooling."""
        if self.model.pooling == "attention":
            weights = keras.ops.convert_to_numpy(self.model.token_weights(self.token_ids))
            return [(POOLING, 0, *POOLING_SIDES, weights[:, None, None, :])]
        if self.model.pooling != "cls":
            raise ValueError(f"no attention shows what {self.model.pooling!r} pooling read; use cls or attention")
        _, scores = self.model.encoder(self.token_ids, training=False, return_attention_scores=True)
        scores = stack_attention_maps(ENCODER_STACK, scores)
        return [
            (CLS_ROW, layer, *CLS_ROW_SIDES,
             keras.ops.convert_to_numpy(scores[attention_map_name(ENCODER, layer)])[:, :, :1, :])
            for layer in range(len(scores))
        ]

    def log(self, step):
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        maps = self._maps()
        predictions = np.argmax(keras.ops.convert_to_numpy(self.model(self.token_ids, training=False)), axis=-1)
        with self._writer.as_default(step=step):
            for index, (ids, text, label) in enumerate(zip(self.token_ids, self.texts, self.labels)):
                length = int(np.count_nonzero(ids))
                tokens = [token.decode("utf-8") for token in self.tokenizer.id_to_token(ids[:length]).numpy()]
                query_side, key_side = maps[0][2:4]
                query_tokens = tokens[:1] if maps[0][0] == CLS_ROW else [POOLING_QUERY]
                write_sample(
                    index,
                    {"text": text, "label": self._name(label), "prediction": self._name(int(predictions[index]))},
                    {query_side: query_tokens, key_side: tokens},
                    [(kind, layer, queries, keys, weights[index, ..., :length])
                     for kind, layer, queries, keys, weights in maps],
                )
        self._writer.flush()


class LanguageModelAttentionLogger(keras.callbacks.Callback):
    """What a language model attends to while it writes, for the Attention tab, every epoch.

    Each prompt is continued greedily (what the model "thinks" now, and the
    same every time for the same weights), then the whole text is read once
    more to get every layer's causal self-attention: row t is what the model
    looked at when it chose token t + 1, so the rows past the prompt show
    how each generated word was made. Written per epoch with the prompt and
    the text (`keras_transformer.tensorboard_plugin.summaries`; kind
    "decoder_self", both axes the text's tokens).

    Args:
        prompts: a few prompts, such as the first words of validation texts.
        tokenizer: the run's `WordPieceTokenizer`.
        log_dir: where to write (`RUN_DIR/logs/samples`, say).
        max_new_tokens: tokens each continuation may add.

    Example:
    >>> logger = LanguageModelAttentionLogger(["This movie was"], tokenizer, "runs/lm/logs/samples")
    >>> model.fit(windows, epochs=3, callbacks=[logger])
    """

    def __init__(self, prompts, tokenizer, log_dir, max_new_tokens=20):
        super().__init__()
        self.prompts = [str(prompt) for prompt in prompts]
        if not self.prompts:
            raise ValueError("LanguageModelAttentionLogger needs at least one prompt")
        self.tokenizer = tokenizer
        self.log_dir = log_dir
        self.max_new_tokens = max_new_tokens
        self._writer = None

    def on_epoch_end(self, epoch, logs=None):
        self.log(step=epoch + 1)

    def log(self, step):
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        # The model's window bounds what it may add beside the prompt.
        max_new_tokens = min(self.max_new_tokens, self.model.max_length // 2)
        generator = Generator(self.model, self.tokenizer, temperature=0, max_new_tokens=max_new_tokens)
        results = generator.attention_maps(self.prompts)
        with self._writer.as_default(step=step):
            for index, (prompt, result) in enumerate(zip(self.prompts, results)):
                tf.summary.text(f"sample_{index}/text", f"| | |\n|---|---|\n| prompt | {prompt} |\n"
                                f"| model (greedy) | {result['text']} |")
                write_sample(
                    index,
                    {"prompt": prompt, "text": result["text"]},
                    {TEXT_SIDE: result["tokens"]},
                    [(DECODER_SELF, parse_attention_map_name(name)[1], TEXT_SIDE, TEXT_SIDE, weights)
                     for name, weights in result["attention"].items()],
                )
        self._writer.flush()


def _has_sklearn():
    try:
        import sklearn  # noqa: F401  (only whether it is there)
    except ImportError:
        return False
    return True


__all__ = ["AttentionMapLogger", "EmbeddingProjectorLogger", "LanguageModelAttentionLogger", "attention_samples", "pca_2d"]
