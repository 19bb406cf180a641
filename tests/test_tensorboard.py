"""Attention maps in TensorBoard: real event files, a real TensorBoard server, a real browser."""

import json
import shutil
import subprocess
import urllib.request
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.tensorboard_loggers import AttentionMapLogger
from keras_transformer.tensorboard_plugin.server import serve
from keras_transformer.text import WordPieceTokenizer
from keras_transformer.visualization import figure_to_png, plot_attention

PAIRS = [
    ("Ein Hund sieht die Katze.", "A dog sees the cat."),
    ("Die Katze schläft.", "The cat sleeps."),
    ("Ein Mann sieht einen Hund.", "A man sees a dog."),
    ("Die Frau schläft im Haus.", "The woman sleeps in the house."),
] * 8
LAYERS, HEADS = 2, 2


def event_summaries(directory):
    """`{tag: [(step, tensor proto, plugin)]}` from the event files under `directory`."""
    summaries = {}
    for path in Path(directory).rglob("events.out.tfevents.*"):
        for record in tf.data.TFRecordDataset(str(path)):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                plugin = value.metadata.plugin_data.plugin_name
                summaries.setdefault(value.tag, []).append((event.step, value.tensor, plugin))
    return summaries


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
    """A tiny translation model fitted for two epochs with the AttentionMapLogger."""
    keras.utils.set_random_seed(0)
    source = WordPieceTokenizer.learn([s for s, _ in PAIRS], vocab_size=60)
    target = WordPieceTokenizer.learn([t for _, t in PAIRS], vocab_size=60)
    model = kt.models.Transformer(
        source.vocab_size, target.vocab_size, num_layers=LAYERS, d_model=16, num_heads=HEADS, d_ff=32, max_length=16
    )
    source_ids = source.tokenize([s for s, _ in PAIRS]).to_tensor()
    target_ids = target.tokenize([t for _, t in PAIRS]).to_tensor()
    # Plain SGD: the logger's summaries are under test, not learning; Adam's slots triple the traced step.
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0))
    log_dir = tmp_path_factory.mktemp("logs")
    logger = AttentionMapLogger(PAIRS[:2], str(log_dir / "samples"), source, target, bleu_pairs=PAIRS[:4])
    model.fit((source_ids, target_ids[:, :-1]), target_ids[:, 1:], epochs=2, batch_size=8, verbose=0, callbacks=[logger])
    return log_dir, logger


@pytest.mark.slow  # fit, a translation per sample and twelve heatmaps drawn
def test_the_callback_writes_labelled_heatmaps_texts_and_bleu(logged_run):
    log_dir, logger = logged_run
    summaries = event_summaries(log_dir)
    for sample in (0, 1):
        for kind in ("encoder", "decoder_self", "cross"):
            for layer in range(LAYERS):
                tag = f"sample_{sample}/{kind}/layer_{layer}"
                assert tag in summaries, sorted(summaries)
                ((step, tensor, plugin),) = summaries[tag]  # drawn once, at the end of training
                assert step == 2 and plugin == "images"
                # Image summaries hold width, height and the encoded PNG.
                width, height, png = tf.make_ndarray(tensor)
                image = tf.io.decode_png(png).numpy()
                assert image.shape[:2] == (int(height), int(width)) and image.shape[0] > 100
                assert image.std() > 0, "a blank image"
        # The Attention tab's weights and the translation, after every epoch.
        assert [step for step, _, _ in summaries[f"attention/sample_{sample}/cross/layer_0"]] == [1, 2]
        ((_, _, plugin), (_, text, _)) = summaries[f"sample_{sample}/translation"]
        assert plugin == "text" and PAIRS[sample][0].encode() in tf.make_ndarray(text).item()
    assert [step for step, _, _ in summaries["val_bleu"]] == [1, 2]
    assert all(0.0 <= float(tf.make_ndarray(bleu)) <= 100.0 for _, bleu, _ in summaries["val_bleu"])


def test_plot_attention_labels_the_axes_with_the_tokens():
    weights = np.random.default_rng(0).dirichlet(np.ones(4), size=(3, 2))  # 3 heads, 2 queries, 4 keys
    figure = plot_attention(weights, [b"Der", b"Hund", b""], ["[START]", "A", "dog", "[END]"], heads=[0, 2])
    panels = [axis for axis in figure.axes if axis.get_title().startswith("head")]
    assert [axis.get_title() for axis in panels] == ["head 0", "head 2"]
    assert [label.get_text() for label in panels[0].get_xticklabels()] == ["[START]", "A", "dog", "[END]"]
    assert [label.get_text() for label in panels[0].get_yticklabels()] == ["Der", "Hund"]
    assert [label.get_text() for label in panels[1].get_yticklabels()] == ["", ""]  # shared with the row
    assert figure_to_png(figure)[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="do not fit attention"):
        plot_attention(weights, ["a", "b", "c"], ["x"])


def test_bad_logger_settings_are_refused():
    with pytest.raises(ValueError, match="at least one"):
        AttentionMapLogger([], "logs", None, None)
    with pytest.raises(ValueError, match="unknown attention kinds"):
        AttentionMapLogger(PAIRS[:1], "logs", None, None, kinds=["decoder"])


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def image_tags(url):
    """TensorBoard's image tags by run, once it has read some; {} before (or while it is not answering)."""
    try:
        with urllib.request.urlopen(f"{url}/data/plugin/images/tags", timeout=5) as answer:
            return json.load(answer)
    except OSError:
        return {}


@pytest.mark.slow
def test_tensorboard_serves_the_maps_and_a_browser_renders_them(logged_run, tmp_path):
    log_dir, _ = logged_run
    chromium = find_chromium()
    assert chromium, "headless Chromium is needed (make test installs Debian's chromium: scripts/test-prerequisites.sh)"
    with serve(log_dir, ready=image_tags) as url:
        tags = image_tags(url)
        image_tags_shown = {tag for run_tags in tags.values() for tag in run_tags}
        assert "sample_0/cross/layer_0" in image_tags_shown
        assert f"sample_1/encoder/layer_{LAYERS - 1}" in image_tags_shown

        screenshot = tmp_path / "images.png"
        subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--virtual-time-budget=20000", "--window-size=1280,1000", f"--screenshot={screenshot}",
             f"{url}/?darkMode=false#images"],
            capture_output=True, timeout=180, check=False,
        )
        assert screenshot.exists(), "Chromium wrote no screenshot"
        pixels = tf.io.decode_png(screenshot.read_bytes()).numpy()
        assert pixels.shape[0] >= 900 and pixels.shape[1] >= 1200
        # The heatmaps are drawn in viridis: a page that failed to show them has next to no such pixels.
        from matplotlib import colormaps

        viridis = (colormaps["viridis"](np.linspace(0, 1, 64))[:, :3] * 255).astype(np.int32)
        rgb = pixels[::2, ::2, :3].reshape(-1, 1, 3).astype(np.int32)
        heatmap_pixels = (np.abs(rgb - viridis[None]).sum(axis=-1).min(axis=1) < 12).sum()
        assert heatmap_pixels > 5000, heatmap_pixels


def test_the_projector_logger_writes_embeddings_metadata_and_a_projection(tmp_path):
    from tensorboard.plugins import projector
    from google.protobuf import text_format

    from keras_transformer.tensorboard_loggers import EmbeddingProjectorLogger, pca_2d

    rng = np.random.default_rng(0)
    # [CLS] = 1, then tokens 2..9; label 1 when token 9 appears.
    ids = np.concatenate([np.ones((64, 1), "int32"), rng.integers(2, 10, (64, 7)).astype("int32")], axis=1)
    labels = (ids == 9).any(axis=1).astype("int32")
    texts = [" ".join(map(str, row)) for row in ids]
    model = kt.models.TransformerClassifier(
        vocab_size=10, num_classes=2, num_layers=1, d_model=16, num_heads=2, d_ff=32, max_length=8
    )
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))  # as above
    log_dir = tmp_path / "embeddings"
    logger = EmbeddingProjectorLogger(ids[:20], labels[:20], texts[:20], str(log_dir), tsne=False)
    model.fit(ids, labels, epochs=2, batch_size=16, verbose=0, callbacks=[logger])

    config = text_format.Parse((log_dir / "projector_config.pbtxt").read_text(), projector.ProjectorConfig())
    (entry,) = config.embeddings
    assert entry.metadata_path == "metadata.tsv"
    stored = tf.train.load_variable(str(log_dir / "embeddings.ckpt"), entry.tensor_name)
    np.testing.assert_allclose(stored, keras.ops.convert_to_numpy(model.embed(ids[:20])), atol=1e-5)
    rows = (log_dir / "metadata.tsv").read_text(encoding="utf-8").splitlines()
    assert rows[0] == "label\ttext" and len(rows) == 21 and rows[1] == f"{labels[0]}\t{texts[0]}"
    steps = sorted(step for step, _, _ in event_summaries(log_dir)["embeddings/pca"])
    assert steps == [1, 2]

    # PCA puts the direction of largest spread first.
    points = rng.normal(size=(200, 3)) * np.array([10.0, 1.0, 0.1])
    projected = pca_2d(points)
    assert projected.shape == (200, 2) and projected[:, 0].std() > 5 * projected[:, 1].std()
    with pytest.raises(ValueError, match="the same sample"):
        EmbeddingProjectorLogger(ids[:5], labels[:4], texts[:5], str(log_dir))
