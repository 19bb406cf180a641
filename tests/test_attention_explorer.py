"""The attention explorer: TensorBoard's Attention tab and its HTML file, in a real server and a real browser.

A tiny translator, a tiny classifier and a tiny language model log two
epochs with their attention loggers; a `tensorboard` process serves the logs; Debian's
Chromium, driven by Playwright (pointed at the system browser: nothing is
downloaded), opens the tab, picks a layer and a head, points at a source
token and reads from the page which lines are drawn.
"""

import json
import time
import urllib.error
import urllib.request

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.tensorboard_loggers import (
    AttentionMapLogger,
    ClassifierAttentionLogger,
    LanguageModelAttentionLogger,
)
from keras_transformer.text import WordPieceTokenizer

from keras_transformer.tensorboard_plugin.server import serve

from test_tensorboard import PAIRS, find_chromium

LAYERS, HEADS, EPOCHS = 2, 2, 2
TEXTS = ["a good film", "a bad film", "good", "bad and long film", "not good"] * 4


def log_epochs(logger, model, inputs, targets, loss, **log_options):
    """What `fit(..., callbacks=[logger])` logs over EPOCHS epochs, without tracing a training step.

    The tab shows the loggers' summaries, not what a model learned: one eager SGD step between
    epochs is enough for each epoch's maps to differ, at a fraction of what three traced `fit`s cost
    (the loggers under `fit` are test_tensorboard.py's, test_language_model.py's and
    test_classifier_run.py's). `log(step)` is what each logger's `on_epoch_end` calls.
    """
    optimizer = keras.optimizers.SGD(0.5)
    model(inputs)  # built, as `fit` builds it before the first epoch ends
    logger.set_model(model)
    for epoch in range(1, EPOCHS + 1):
        if epoch > 1:
            with tf.GradientTape() as tape:
                value = loss(targets, model(inputs, training=True))
            optimizer.apply(tape.gradient(value, model.trainable_variables), model.trainable_variables)
        logger.log(step=epoch, **log_options)


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory):
    """Two epochs of attention summaries: a translator's (run "samples"), a classifier's ("classifier") and a
    language model's ("language_model")."""
    keras.utils.set_random_seed(0)
    logs = tmp_path_factory.mktemp("logs")
    source = WordPieceTokenizer.learn([s for s, _ in PAIRS], vocab_size=60)
    target = WordPieceTokenizer.learn([t for _, t in PAIRS], vocab_size=60)
    translator = kt.models.Transformer(
        source.vocab_size, target.vocab_size, num_layers=LAYERS, d_model=16, num_heads=HEADS, d_ff=32, max_length=16
    )
    source_ids = source.tokenize([s for s, _ in PAIRS]).to_tensor()
    target_ids = target.tokenize([t for _, t in PAIRS]).to_tensor()
    # No heatmap images: drawing them is test_tensorboard.py's.
    log_epochs(AttentionMapLogger(PAIRS[:2], str(logs / "samples"), source, target), translator,
               (source_ids, target_ids[:, :-1]), target_ids[:, 1:], kt.training.MaskedSparseCrossEntropy(0.1),
               images=False)

    words = WordPieceTokenizer.learn(TEXTS, vocab_size=40, reserved_tokens=kt.text.CLASSIFIER_TOKENS)
    ids = words.tokenize_with_cls(TEXTS, 8).numpy()
    labels = np.array(["good" in text and "not" not in text for text in TEXTS], "int32")
    classifier = kt.models.TransformerClassifier(
        vocab_size=words.vocab_size, num_classes=2, num_layers=LAYERS, d_model=16, num_heads=HEADS, d_ff=32,
        max_length=8,
    )
    watcher = ClassifierAttentionLogger(ids[:2], TEXTS[:2], labels[:2], words, str(logs / "classifier"),
                                        class_names=["negative", "positive"])
    log_epochs(watcher, classifier, ids, labels, keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    language_model = kt.models.LanguageModel(
        vocab_size=source.vocab_size, num_layers=LAYERS, d_model=16, num_heads=HEADS, d_ff=32, max_length=16
    )
    writer = LanguageModelAttentionLogger([PAIRS[0][0]], source, str(logs / "language_model"), max_new_tokens=5)
    log_epochs(writer, language_model, source_ids[:, :-1], source_ids[:, 1:], kt.training.MaskedSparseCrossEntropy(0.0))
    return logs


@pytest.fixture(scope="module")
def tensorboard(log_dir):
    """A `tensorboard` process on a free port of 127.0.0.1, once the Attention tab has data; stopped by its pid."""
    with serve(log_dir) as url:
        yield url


def get_json(url):
    with urllib.request.urlopen(url, timeout=30) as answer:
        return json.load(answer)


def plugin(url, route):
    return get_json(f"{url}/data/plugin/attention/{route}")


@pytest.mark.slow
def test_the_plugin_serves_every_layer_and_head_with_its_tokens(tensorboard):
    index = plugin(tensorboard, "index")
    runs = {run["run"]: run for run in index["runs"]}
    assert set(runs) == {"samples", "classifier", "language_model"}
    samples = runs["samples"]["samples"]
    assert [sample["sample"] for sample in samples] == [0, 1]
    assert samples[0]["steps"] == list(range(1, EPOCHS + 1)) and samples[0]["label"] == PAIRS[0][0]
    assert samples[0]["kinds"] == {kind: list(range(LAYERS)) for kind in ("cross", "decoder_self", "encoder")}
    assert runs["classifier"]["samples"][0]["kinds"] == {"cls": list(range(LAYERS))}

    page = plugin(tensorboard, "sample?run=samples&sample=0&step=2")
    assert page["texts"]["source"] == PAIRS[0][0] and page["texts"]["reference"] == PAIRS[0][1]
    maps = {(entry["kind"], entry["layer"]): entry for entry in page["maps"]}
    assert len(maps) == 3 * LAYERS
    cross = maps[("cross", 1)]
    assert cross["keys"][0] == "[START]" and cross["keys"][-1] == "[END]" and cross["queries"]
    weights = np.array(cross["weights"])
    assert weights.shape == (HEADS, len(cross["queries"]), len(cross["keys"]))
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, atol=1e-3)  # each row a distribution
    decoder = np.array(maps[("decoder_self", 0)]["weights"])
    assert np.all(np.triu(decoder, k=1) == 0), "a target position attends to a later one"

    classified = plugin(tensorboard, "sample?run=classifier&sample=1&step=1")
    assert classified["texts"]["text"] == TEXTS[1] and classified["texts"]["label"] in ("negative", "positive")
    row = classified["maps"][0]
    assert row["queries"] == ["[CLS]"] and row["keys"][0] == "[CLS]" and "bad" in row["keys"]
    assert np.array(row["weights"]).shape == (HEADS, 1, len(row["keys"]))

    # A language model's self-attention over its prompt and what it wrote: both axes the text's tokens.
    assert runs["language_model"]["samples"][0]["kinds"] == {"decoder_self": list(range(LAYERS))}
    written = plugin(tensorboard, "sample?run=language_model&sample=0&step=2")
    assert written["texts"]["prompt"] == PAIRS[0][0] and written["texts"]["text"]
    own = written["maps"][0]
    assert own["sides"] == ["text", "text"] and own["queries"] == own["keys"] and own["keys"][0] == "[START]"
    weights = np.array(own["weights"])
    assert weights.shape == (HEADS, len(own["keys"]), len(own["keys"])) and np.all(np.triu(weights, k=1) == 0)

    # Requests the plugin cannot answer are refused with a reason; the server lives on.
    for route, status in (("sample?run=samples&sample=zero&step=1", 400), ("sample?run=samples&sample=0&step=99", 404),
                          ("sample?run=nowhere&sample=0&step=1", 404)):
        with pytest.raises(urllib.error.HTTPError) as refused:
            plugin(tensorboard, route)
        assert refused.value.code == status and "error" in json.load(refused.value)
    assert plugin(tensorboard, "index") == index


def hover_source_token_of_one_head(frame, run, token_index):
    """Pick `run`, cross-attention, the last layer and head 0 alone; point at source token `token_index`."""
    frame.select_option("#run", run)
    frame.select_option("#kind", "cross")
    frame.select_option("#layer", str(LAYERS - 1))
    for head in range(1, HEADS):
        frame.uncheck(f'input.head-toggle[data-head="{head}"]')
    frame.hover(f'#head-view .token[data-side="key"][data-index="{token_index}"]')
    return frame.eval_on_selector_all(
        "#head-view line.link",
        "lines => lines.map(line => [line.dataset.head, line.dataset.key, line.dataset.state])",
    )


def assert_only_its_lines(lines, token_index):
    highlighted = [line for line in lines if line[2] == "highlighted"]
    assert highlighted, "no line highlighted"
    assert all(head == "0" and key == str(token_index) for head, key, _ in highlighted), highlighted
    assert all(state == "hidden" for _, key, state in lines if key != str(token_index))


def browser(playwright):
    chromium = find_chromium()
    assert chromium, "headless Chromium is needed (make test installs Debian's chromium: scripts/test-prerequisites.sh)"
    return playwright.chromium.launch(
        executable_path=chromium, headless=True,
        args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
    )


def watch_console(page):
    """Console errors of the whole page, and warnings of the explorer (TensorBoard's own UI warns of its own)."""
    problems = []

    def note(message):
        ours = "attention" in message.location.get("url", "") or message.location.get("url", "").startswith("file:")
        if message.type == "error" or (message.type == "warning" and ours):
            problems.append(f"{message.type}: {message.text} ({message.location.get('url')})")

    page.on("console", note)
    page.on("pageerror", lambda error: problems.append(str(error)))
    return problems


@pytest.mark.slow
def test_in_the_attention_tab_pointing_at_a_source_word_shows_only_its_lines(tensorboard, tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = browser(playwright)
        page = chromium.new_page(viewport={"width": 1280, "height": 1000})
        problems = watch_console(page)
        page.goto(f"{tensorboard}/?darkMode=false#attention")
        frame = None
        deadline = time.time() + 60
        while frame is None and time.time() < deadline:
            frame = next((each for each in page.frames if "plugin_entry.html?name=attention" in each.url), None)
            page.wait_for_timeout(200)  # lets Playwright take in the page's events (time.sleep would not)
        assert frame is not None, "TensorBoard did not open the Attention tab"
        frame.wait_for_selector("#head-view line.link", timeout=60_000)
        lines = hover_source_token_of_one_head(frame, "samples", 1)
        assert_only_its_lines(lines, 1)

        # The epoch slider: the first epoch's weights; the selection is kept.
        frame.fill("#step", "0")
        frame.wait_for_function("document.querySelector('#step-label').textContent.includes('1')")
        share = frame.get_attribute("#share-link", "href")
        assert "step=1" in share and "kind=cross" in share and f"layer={LAYERS - 1}" in share

        screenshot = tmp_path / "explorer.png"
        page.screenshot(path=str(screenshot))
        # The shared link opens the same selection on its own page.
        alone = chromium.new_page(viewport={"width": 1280, "height": 900})
        problems += watch_console(alone)
        alone.goto(share)
        alone.wait_for_selector("#head-view line.link")
        assert alone.eval_on_selector("#kind", "select => select.value") == "cross"
        assert alone.eval_on_selector("#layer", "select => select.value") == str(LAYERS - 1)
        assert not alone.is_checked(f'input.head-toggle[data-head="{HEADS - 1}"]')
        chromium.close()
    assert not problems, problems
    assert_drawn(screenshot)


def assert_drawn(screenshot):
    """A picture of the page with the lines on it: many pixels neither white nor grey."""
    import tensorflow as tf

    pixels = tf.io.decode_png(screenshot.read_bytes()).numpy()[..., :3].astype(int)
    coloured = (pixels.max(axis=-1) - pixels.min(axis=-1)) > 40
    assert coloured.sum() > 2000, f"only {coloured.sum()} coloured pixels: is the drawing there?"


@pytest.mark.slow
def test_plot_attention_html_is_one_file_that_works_offline(trained_demo_run, tmp_path):
    from playwright.sync_api import sync_playwright

    from helpers import cli_here  # in this process: the page is under test, not the console script

    run, _ = trained_demo_run
    html = tmp_path / "attention.html"
    result = cli_here("plot-attention", run, "Der Hund sieht die Katze.", "--html", html)
    assert f"attention: {html}" in result.stdout
    with sync_playwright() as playwright:
        chromium = browser(playwright)
        page = chromium.new_page(viewport={"width": 1280, "height": 900})
        problems = watch_console(page)
        requests = []
        page.on("request", lambda request: requests.append(request.url))
        page.goto(html.as_uri())
        page.wait_for_selector("#head-view line.link")
        kinds = page.eval_on_selector_all("#kind option", "options => options.map(option => option.value)")
        assert sorted(kinds) == ["cross", "decoder_self", "encoder"]
        lines = hover_source_token_of_one_head(page, "sentence", 2)
        assert_only_its_lines(lines, 2)
        page.click("#view-matrix")
        assert page.locator(".matrix-panel").count() == 1  # the one head chosen
        chromium.close()
    assert not problems, problems
    assert all(url.startswith("file:") for url in requests), f"the page fetched something: {requests}"
