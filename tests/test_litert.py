"""On-device exports: a run as one LiteRT file, run by the LiteRT interpreter as it is, with no TensorFlow op in it."""

import dataclasses
import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import built_once
from helpers import DOCUMENT, ENV, check_one_answer_per_line, cli_here

from keras_transformer.data import demo_corpus
from keras_transformer.export import litert
from keras_transformer.inference.tracing import graph_function
from keras_transformer.on_device import LiteRTModel
from keras_transformer.runs import classification, translation
from keras_transformer.text import WordPieceTokenizer

# The demo run's validation sentences, and what a phone's user may type beside them.
SENTENCES = [source for source, _ in demo_corpus()["val"][:40]] + [
    "", "The dog, the cat (and the bird) sleep!", "Tōkyō 東京 2024 🙂 café", "the " * 120,
]
# The tokenizer test sentences: accents, digits, CJK, emoji, case, punctuation, empty, over-long.
TOKENIZER_SENTENCES = [
    "Ein Mann fährt Fahrrad.", "Zwei junge MÄNNER spielen Fußball im Park.", "Eine Frau (mit Hut) liest, oder?",
    "A man in a T-shirt isn't riding the dog's bike.", "ÉNORME Succès: İstanbul ΑΒΓ Ωμέγα 42 km/h",
    "東京タワー 🙂 emoji", "", " ", "x" * 300, "word " * 200, "ΟΔΟΣ ΟΔΟΣ. Σ ΑΣΑ",
]
TEXTS = tf.TensorSpec([None], tf.string)


@pytest.mark.slow
def test_float32_greedy_translates_token_for_token_as_the_run_and_beam_4_never_worse(litert_exports):
    run, exports = litert_exports
    for name, beam_size in (("greedy", 1), ("beam", 4)):
        translator = translation.load_translator(str(run), beam_size=beam_size)
        expected = translator(tf.constant(SENTENCES))
        on_device = LiteRTModel(exports / name).run(SENTENCES)
        ours = [text.decode() for text in expected["translation"].numpy()]
        theirs = [text.decode() for text in on_device["translation"]]
        same = sum(a == b for a, b in zip(ours, theirs))
        if beam_size == 1:
            assert theirs == ours
        else:
            assert same >= 0.97 * len(SENTENCES), list(zip(ours, theirs))
        # Where they differ, the file's hypothesis scores at least as well (rounding aside).
        assert np.all(on_device["score"] >= expected["score"].numpy() - 1e-4)
        assert theirs[SENTENCES.index("")] == ""


def test_a_beam_search_file_translates_a_large_batch_in_parts_as_it_would_at_once(litert_exports, monkeypatch,
                                                                                    tmp_path):
    # The demo model's cache is small: its files take whole batches. A file exported where a batch's
    # cache counts as large takes ROWS_PER_RUN rows a run: beam 4 with the greedy path beside it is 5
    # rows a sentence.
    run, exports = litert_exports
    assert LiteRTModel(exports / "beam").settings["sentences_per_run"] == 32
    monkeypatch.setattr(litert.signatures, "CACHE_BYTES_PER_POSITION", 0)
    # The cache's size sets the runner's settings (litert.json), not the converted graph: the export
    # writes the session's beam file, converted once.
    monkeypatch.setattr(litert.converter, "convert",
                        lambda service, quantization=None: (exports / "beam" / litert.MODEL_FILE).read_bytes())
    translation.export_litert(str(run), str(tmp_path / "beam"), beam_size=4)
    beam = LiteRTModel(tmp_path / "beam")
    assert beam.settings["keep_greedy"] and beam.settings["sentences_per_run"] == litert.ROWS_PER_RUN // 5
    texts = SENTENCES[:40]
    runs = []  # the batches the file is given, seen on their way in
    answer = LiteRTModel._answer
    monkeypatch.setattr(LiteRTModel, "_answer", lambda self, runner, batch, **inputs: (
        runs.append(len(batch)), answer(self, runner, batch, **inputs))[1])
    in_parts = beam.translate(texts)
    assert runs == [12, 12, 12, 4]
    at_once = beam.translate(texts, batch_size=len(texts))
    assert runs[4:] == [40]
    assert sum(a == b for a, b in zip(in_parts, at_once)) >= 0.97 * len(texts), list(zip(in_parts, at_once))


def test_quantized_files_are_smaller_and_translate(litert_exports):
    run, exports = litert_exports
    sizes = {name: (exports / name / litert.MODEL_FILE).stat().st_size for name in ("greedy", "int8", "float16")}
    assert sizes["int8"] < sizes["float16"] < sizes["greedy"], sizes
    reference = LiteRTModel(exports / "greedy").translate(SENTENCES[:20])
    for name in ("int8", "float16"):
        model = LiteRTModel(exports / name)
        assert model.settings["quantization"] == name
        translated = model.translate(SENTENCES[:20])
        assert all(translated) and sum(a == b for a, b in zip(translated, reference)) >= 12, (name, translated)


@pytest.fixture(scope="module")
def published_int8(tmp_path_factory):
    """The published fixture run's int8 file (beam 2): it shares one vocabulary and ties the output projection to it.

    Returns `(its directory, the converted file before int8_lookups rewrote it)`: `int8_lookups` is the
    conversion's last step, bytes in, bytes out.
    """
    from test_publish import PUBLISHED

    out = tmp_path_factory.mktemp("published") / "int8"
    rewrite, before_rewrite = litert.converter.int8_lookups, []

    def recorded_then_rewritten(model):
        before_rewrite.append(model)
        return rewrite(model)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(litert.converter, "int8_lookups", recorded_then_rewritten)
        translation.export_litert(str(PUBLISHED / "run"), str(out), quantization="int8", beam_size=2)
    return out, before_rewrite[0]


def test_a_shared_tied_table_is_stored_once_in_the_int8_file(published_int8):
    # The table is looked up (both embeddings) and multiplied by, and the converter quantizes it twice.
    out, _ = published_int8
    content = (out / litert.MODEL_FILE).read_bytes()
    copies = int8_weights(content)
    for (shape, first), (other_shape, second) in itertools.combinations(copies, 2):
        assert shape != other_shape or np.abs(first - second).max() > 0.1 * np.abs(first).max(), f"two copies of {shape}"
    # The converter's metadata survives the rewrite (the runtime version a loader checks).
    from ai_edge_litert import schema_py_generated as schema

    model = schema.Model.GetRootAs(content, 0)
    metadata = {model.Metadata(index).Name().decode(): model.Buffers(model.Metadata(index).Buffer()).DataLength()
                for index in range(model.MetadataLength())}
    assert metadata.get("min_runtime_version", 0) > 0, metadata
    translated = LiteRTModel(out).translate(["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Park."])
    assert all(isinstance(text, str) for text in translated)


def test_the_int8_files_lookups_read_int8_rows_and_translate_as_the_whole_table_did(published_int8, tmp_path):
    # Without the rewrite the tied table is turned into floats whole, and the search's loops carry those.
    published, before_rewrite = published_int8
    texts = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Park.", "Eine Frau liest ein Buch.", ""]
    # The same export as the file the converter made, unrewritten: its bytes, its operators.
    shutil.copytree(published, tmp_path / "whole")
    (tmp_path / "whole" / litert.MODEL_FILE).write_bytes(before_rewrite)
    settings = json.loads((published / litert.SETTINGS_FILE).read_text())
    settings["operators"] = litert.operators(before_rewrite)
    (tmp_path / "whole" / litert.SETTINGS_FILE).write_text(json.dumps(settings))
    files = {"rows": (published / litert.MODEL_FILE).read_bytes(), "whole": before_rewrite}
    assert whole_tables_dequantized(files["whole"]) and not whole_tables_dequantized(files["rows"])
    rows, whole = LiteRTModel(published).run(texts), LiteRTModel(tmp_path / "whole").run(texts)
    assert list(rows["translation"]) == list(whole["translation"])
    np.testing.assert_array_equal(rows["score"], whole["score"])


def whole_tables_dequantized(content):
    """The tensors of a LiteRT file that a `DEQUANTIZE` fills from a whole int8 table (2-D, a scale per row)."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromObj(schema.Model.GetRootAs(content, 0))
    dequantize = {index for index, code in enumerate(model.operatorCodes)
                  if max(code.builtinCode, code.deprecatedBuiltinCode) == schema.BuiltinOperator.DEQUANTIZE}
    found = []
    for subgraph in model.subgraphs:
        for operator in subgraph.operators:
            table = subgraph.tensors[operator.inputs[0]]
            if (operator.opcodeIndex in dequantize and len(table.shape) == 2 and table.quantization is not None
                    and table.quantization.scale is not None and len(table.quantization.scale) == table.shape[0] > 1):
                found.append(subgraph.tensors[operator.outputs[0]].name)
    return found


def int8_weights(content):
    """`[(shape, dequantized values)]` of every int8 weight buffer of a LiteRT file, each buffer once."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.Model.GetRootAs(content, 0)
    found = {}
    for index in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(index)
        for number in range(subgraph.TensorsLength()):
            tensor = subgraph.Tensors(number)
            data = model.Buffers(tensor.Buffer()).DataAsNumpy()
            if tensor.Type() == schema.TensorType.INT8 and not isinstance(data, int) and tensor.ShapeLength() == 2:
                shape = tuple(tensor.ShapeAsNumpy())
                scale = tensor.Quantization().ScaleAsNumpy()
                scale = scale.reshape(-1, 1) if tensor.Quantization().QuantizedDimension() == 0 else scale.reshape(1, -1)
                if tensor.Buffer() not in found or scale.size > 1:  # a lookup reads a table's rows unscaled
                    found[tensor.Buffer()] = (shape, data.view(np.int8).reshape(shape) * scale)
    return list(found.values())


def test_the_files_hold_builtin_operators_and_tensorflow_texts_only(litert_exports):
    _, exports = litert_exports
    for name in ("greedy", "beam", "int8", "float16"):
        names = litert.operators((exports / name / litert.MODEL_FILE).read_bytes())
        assert "WHILE" in names and "DYNAMIC_UPDATE_SLICE" in names
        assert not [op for op in names if op.startswith("Flex")], names
        custom = {op for op in names if op.upper() != op}
        assert custom <= litert.TEXT_OPERATORS, custom
        assert json.loads((exports / name / litert.SETTINGS_FILE).read_text())["operators"] == names


def test_beam_searchs_top_k_is_sized_when_the_loop_is_prepared(litert_exports):
    """A top-k input with an unknown size in its signature is sized at every step, and LiteRT's loop then copies
    its whole state from step to step (`export.litert.top_k_sized_when_prepared`)."""
    from ai_edge_litert import schema_py_generated as schema

    _, exports = litert_exports
    model = schema.Model.GetRootAs((exports / "beam" / litert.MODEL_FILE).read_bytes(), 0)
    top_k_inputs = []
    for subgraph in (model.Subgraphs(index) for index in range(model.SubgraphsLength())):
        for operator in (subgraph.Operators(index) for index in range(subgraph.OperatorsLength())):
            code = model.OperatorCodes(operator.OpcodeIndex())
            if max(code.BuiltinCode(), code.DeprecatedBuiltinCode()) == schema.BuiltinOperator.TOPK_V2:
                top_k_inputs.append(subgraph.Tensors(operator.Inputs(0)))
    assert top_k_inputs
    assert all(-1 not in tensor.ShapeSignatureAsNumpy().tolist() for tensor in top_k_inputs
               if not tensor.ShapeSignatureIsNone())


def test_a_file_that_would_need_tensorflow_ops_is_refused_and_nothing_is_written(tmp_path):
    class NeedsFlex(litert.LiteRTService):
        def __init__(self):
            model = tf.keras.layers.Dense(1)  # any variables at all
            model.build((None, 1))
            super().__init__(model, {"shout": (self.shout, [litert.TEXT])})

        def shout(self, text):  # regex_replace: a TensorFlow op, Flex only
            return {"text": tf.strings.regex_replace(text, "a", "A")}

        def settings(self):
            return {"kind": "test"}

    with pytest.raises(Exception, match="RegexReplace|regex"):
        litert.export_litert(NeedsFlex(), str(tmp_path / "out"))
    assert list(tmp_path.iterdir()) == []


def test_malformed_requests_are_answered_or_refused_in_one_line_and_the_interpreter_serves_on(litert_exports):
    _, exports = litert_exports
    model = LiteRTModel(exports / "greedy")
    expected = model.translate(["The dog runs."])
    assert model.translate([]) == [] and model.run([])["translation"].shape == (0,)  # the file's empty batch
    long_text = model.translate(["The dog runs. " * 700])  # 10,000 characters: cut as the SavedModel cuts
    assert len(long_text) == 1 and isinstance(long_text[0], str)
    assert len(model.translate([b"The dog \xff\xfe runs."])) == 1  # invalid UTF-8: replaced
    for bad, message in ((42, "list of strings"), ("The dog runs.", "list of strings"),
                         ([["nested"]], "list of strings"), ([1.5], "list of strings")):
        with pytest.raises(ValueError, match=message) as refused:
            model.translate(bad)
        assert "\n" not in str(refused.value)
    # A batch of no texts, fewer than none or a part of one would translate nothing, or loop forever.
    for bad in (0, -1, 1.5, "8", np.ones((2, 2), int)):
        with pytest.raises(ValueError, match="batch_size must be a whole number of texts, at least 1") as refused:
            model.translate(["The dog runs."], batch_size=bad)
        assert "\n" not in str(refused.value)
    assert model.translate(["The dog runs."], batch_size=np.int64(1)) == expected
    assert model.translate(["The dog runs."]) == expected


@pytest.mark.slow
def test_the_command_line_exports_translates_without_tensorflow_and_refuses_an_existing_directory(litert_exports,
                                                                                                   tmp_path):
    run, exports = litert_exports
    command = Path(sys.executable).with_name("keras-transformer")
    result = subprocess.run([str(command), "translate", "--litert", str(exports / "greedy"), *SENTENCES[:3]],
                            capture_output=True, text=True, env=ENV, timeout=300, check=True)
    assert result.stdout.splitlines() == LiteRTModel(exports / "greedy").translate(SENTENCES[:3])
    assert result.stderr == ""
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; sys.argv = ['keras-transformer']; from keras_transformer import cli; "
         f"cli.main(['translate', '--litert', {str(exports / 'greedy')!r}, 'A dog.']); "
         "print('tensorflow' in sys.modules)"],
        capture_output=True, text=True, env=ENV, timeout=300, check=True)
    assert probe.stdout.splitlines()[-1] == "False"
    refused = cli_here("export", run, exports / "greedy", "--format", "litert", check=False)
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1].startswith("keras-transformer: error: ") and "already exists" in refused.stderr
    refused = cli_here("export", run, tmp_path / "new", "--format", "litert", "--quantization", "bfloat16",
                       check=False)
    assert refused.returncode == 2 and "must be one of" in refused.stderr and not (tmp_path / "new").exists()


@pytest.mark.slow
def test_a_document_comes_out_of_the_file_with_as_many_lines_each_translated_as_if_alone(litert_exports):
    run, exports = litert_exports
    given = ["--litert", exports / "greedy"]
    result = cli_here("translate", *given, input=DOCUMENT)
    check_one_answer_per_line(result, lambda text: cli_here("translate", *given, text).stdout.removesuffix("\n"))
    pieces = translation.load_translator(str(run)).pieces_read
    assert f"line 5 is longer than the model reads: only its first {pieces} pieces were translated" in result.stderr
    # A command line's own bad bytes (Python's surrogates) and blank arguments: one answer each, in order.
    alone = cli_here("translate", *given, "A dog runs in the park.").stdout
    result = cli_here("translate", *given, "", "A dog runs in the park.", "The young cat \udce9 sleeps.")
    assert result.stdout == "\n" + alone + cli_here("translate", *given, "The young cat \ufffd sleeps.").stdout
    assert result.stderr == "keras-transformer: argument 3: bytes that are not UTF-8 were read as U+FFFD\n"


@pytest.mark.parametrize("lower_case", [False, True])
def test_the_portable_tokenizer_segments_as_ours(lower_case):
    tokenizer = WordPieceTokenizer.learn(TOKENIZER_SENTENCES * 3, vocab_size=200, lower_case=lower_case)
    max_length = 24
    portable = litert.LiteRTTokenizer(tokenizer, max_length).framed(tf.constant(TOKENIZER_SENTENCES)).numpy()
    ours = tokenizer.tokenize(TOKENIZER_SENTENCES).to_tensor().numpy()[:, :max_length]
    ours[np.count_nonzero(ours, axis=1) >= max_length, max_length - 1] = tokenizer.end_id  # cut keeping [END]
    assert portable.tolist() == ours[:, : portable.shape[1]].tolist()
    assert not ours[:, portable.shape[1]:].any()


@pytest.mark.slow
def test_the_classifier_file_gives_the_runs_probabilities(classifier_exports):
    classifier_exports, printed = classifier_exports
    # The export says what it wrote and how to try it, and nothing else (no converter's chatter).
    out = classifier_exports / "litert"
    assert printed["stdout"].splitlines() == [f"exported LiteRT model: {out}",
                                              f"try it:     keras-transformer classify --litert {out} \"...\""]
    assert printed["stderr"] == "", printed["stderr"][-2000:]
    texts = ["The FILM was Great.", "awful, boring ACTORS", "", "Ünïcode İstanbul ÉNORME " * 10, "x"]
    classifier = classification.Classifier(str(classifier_exports / "run"))
    assert classifier.tokenizer.lower_case
    expected = classifier.probabilities(texts)
    model = LiteRTModel(classifier_exports / "litert")
    on_device = model.run(texts)
    np.testing.assert_allclose(on_device["probabilities"], expected, atol=1e-4)
    assert [label for label, _ in model.classify(texts)] == [label for label, _ in classifier.classify(texts)]
    with pytest.raises(ValueError, match="needs a translation export"):
        model.translate(["a"])


@pytest.mark.slow
def test_a_document_is_classified_line_by_line_a_blank_line_answered_blank(classifier_exports):
    classifier_exports, _ = classifier_exports
    for given in (["--litert", classifier_exports / "litert"], [classifier_exports / "run"]):
        result = cli_here("classify", *given, input=DOCUMENT)
        check_one_answer_per_line(result, lambda text: cli_here("classify", *given, text).stdout.removesuffix("\n"))
    assert LiteRTModel(classifier_exports / "litert").classify(["", " ", "x"])[:2] == [(None, None)] * 2


@pytest.mark.slow
def test_the_language_model_file_continues_as_the_run_does(language_model_export):
    from keras_transformer.runs import language_model

    run, export = language_model_export
    prompts = ["A dog", "The young cat sees", "", "Today"]
    model = LiteRTModel(export)
    for settings in (dict(temperature=0), dict(seed=3), dict(seed=4, top_k=5, temperature=0.8),
                     dict(seed=5, top_p=0.9, max_new_tokens=6)):
        expected = language_model.generate(str(run), prompts, **settings)
        assert model.generate(prompts, **settings) == expected, settings
    assert model.generate(prompts, seed=7) == model.generate(prompts, seed=7) != model.generate(prompts, seed=8)
    generator = language_model.load_generator(str(run))
    expected = generator(tf.constant(prompts), seed=0)
    on_device = model.run(prompts)  # serving_default: the export's settings, seed 0
    for name in ("text", "continuation"):
        assert [text.decode() for text in on_device[name]] == [text.decode() for text in expected[name].numpy()]
    np.testing.assert_array_equal(on_device["new_tokens"], expected["new_tokens"].numpy())
    for bad in (dict(top_p=1.5), dict(temperature=-1.0), dict(max_new_tokens=0)):
        with pytest.raises(ValueError, match="must be"):
            model.generate(prompts, **bad)
    assert model.generate(["A dog"], temperature=0) == language_model.generate(str(run), ["A dog"], temperature=0)


@pytest.mark.slow
def test_a_document_is_continued_line_by_line_a_blank_line_from_nothing(language_model_export):
    run, export = language_model_export
    for given in (["--litert", export], [run]):
        given = [*given, "--temperature", "0", "--max-new-tokens", "5"]
        result = cli_here("generate", *given, input=DOCUMENT)
        check_one_answer_per_line(result, lambda text: cli_here("generate", *given, text).stdout.removesuffix("\n"),
                                  blank=cli_here("generate", *given, "").stdout.removesuffix("\n"))


def test_keras_export_to_litert_gives_the_models_logits_with_builtin_operators(tmp_path):
    """The Keras convention, `model.export(path, format="litert")`, on our three models: ids in, logits out."""
    import keras
    from ai_edge_litert.interpreter import Interpreter

    import keras_transformer as kt

    sizes = dict(num_layers=1, d_model=16, num_heads=2, d_ff=32, max_length=20)
    ids = keras.InputSpec(shape=(None, None), dtype="int32")
    source = np.array([[5, 6, 7, 0, 0], [8, 9, 10, 11, 12]], np.int32)
    target = np.array([[1, 5, 6, 0], [1, 2, 3, 4]], np.int32)
    models = {
        "transformer": (kt.models.Transformer(src_vocab_size=50, tgt_vocab_size=50, **sizes), (source, target)),
        "classifier": (kt.models.TransformerClassifier(vocab_size=50, num_classes=2, **sizes), (source,)),
        "language_model": (kt.models.LanguageModel(vocab_size=50, **sizes), (source,)),
    }
    for name, (model, inputs) in models.items():
        expected = np.asarray(model(inputs if len(inputs) > 1 else inputs[0]))
        path = str(tmp_path / f"{name}.tflite")
        model.export(path, format="litert", input_signature=[tuple([ids] * len(inputs)) if len(inputs) > 1 else ids])
        with open(path, "rb") as file:
            names = litert.operators(file.read())
        assert not [op for op in names if op.startswith("Flex")], (name, names)
        runner = Interpreter(model_path=path).get_signature_runner()
        outputs = runner(**dict(zip(sorted(runner.get_input_details()), inputs)))
        np.testing.assert_allclose(list(outputs.values())[0], expected, atol=1e-5, err_msg=name)


# Every pretrained fixture, with the language pair an M2M100 or NLLB import is made for, and another.
PRETRAINED = {"marian-shared-swish": None, "marian-separate-relu": None,
              "m2m100-en-de": (("en", "de"), ("en", "fr")), "nllb-en-de": (("eng_Latn", "deu_Latn"), ("eng_Latn", "fra_Latn"))}


@pytest.fixture(scope="session")
def pretrained_exports(tmp_path_factory):
    """Every pretrained fixture imported as a run, each exported greedy and with the checkpoint's beam 4, and
    greedy as a builtin file (`NAME-builtin`: the checkpoint's SentencePiece models on the host)."""
    from test_pretrained import FIXTURES

    def build(directory):
        for name, pairs in PRETRAINED.items():
            source_lang, target_lang = pairs[0] if pairs else (None, None)
            translation.import_checkpoint(str(FIXTURES / name), str(directory / name), source_lang=source_lang,
                                          target_lang=target_lang)
            for search, beam_size in (("greedy", 1), ("beam", 4)):
                translation.export_litert(str(directory / name), str(directory / f"{name}-{search}"),
                                          beam_size=beam_size)
            translation.export_litert(str(directory / name), str(directory / f"{name}-builtin"), beam_size=1,
                                      ops="builtin")
        return {}

    directory, _ = built_once(tmp_path_factory, "litert-pretrained", build)
    return Path(directory)


@pytest.mark.parametrize("name", list(PRETRAINED))
@pytest.mark.slow
def test_an_imported_checkpoint_translates_on_device_as_its_run_and_hugging_face_do(pretrained_exports, name):
    from test_pretrained import expected

    recorded, _ = expected(name)
    sentences = recorded["sources"] + [">>deu<< A dog.", "  spaces  around  ", "x" * 200]
    for search, beam_size in (("greedy", 1), ("beam", 4)):
        translator = translation.load_translator(str(pretrained_exports / name), beam_size=beam_size)
        runs_own = translator(tf.constant(sentences))
        on_device = LiteRTModel(pretrained_exports / f"{name}-{search}").run(sentences)
        ours = [text.decode() for text in runs_own["translation"].numpy()]
        theirs = [text.decode() for text in on_device["translation"]]
        if beam_size == 1:
            assert theirs == ours
            # Hugging Face's own (the last source is "", which we translate to "", as the run does).
            assert theirs[: len(recorded["sources"]) - 1] == recorded["greedy"]["text"][:-1]
        else:
            assert sum(a == b for a, b in zip(ours, theirs)) >= 0.97 * len(sentences), list(zip(ours, theirs))
            assert np.all(on_device["score"] >= runs_own["score"].numpy() - 1e-4)
    # The builtin file, the checkpoint's SentencePiece model run by the `sentencepiece` package: the same.
    builtin = LiteRTModel(pretrained_exports / f"{name}-builtin")
    assert builtin.settings["tokenizers"]["source"]["kind"] == "sentencepiece"
    assert builtin.translate(sentences) == LiteRTModel(pretrained_exports / f"{name}-greedy").translate(sentences)


@pytest.mark.parametrize("name", [name for name, pairs in PRETRAINED.items() if pairs])
@pytest.mark.slow
def test_a_multilingual_file_translates_each_texts_own_language_pair_and_refuses_unknown_codes(pretrained_exports,
                                                                                              name):
    (source, target), (other_source, other_target) = PRETRAINED[name]
    translator = translation.load_translator(str(pretrained_exports / name), beam_size=1)
    model = LiteRTModel(pretrained_exports / f"{name}-greedy")
    sentences = ["A dog runs in the park.", "Two men play football.", "", "A woman reads a book."]
    sources, targets = [source, other_source] * 2, [target, other_target] * 2
    ours = translator.translate_between(tf.constant(sentences), tf.constant(sources), tf.constant(targets))
    assert model.translate(sentences, source_language=sources, target_language=targets) == [
        text.decode() for text in ours["translation"].numpy()]
    # The pair the file was made for is what it translates without codes.
    made_for = model.translate(sentences[:2])
    assert model.translate(sentences[:2], source_language=source, target_language=target) == made_for
    # Called directly (as an app would), the file answers a text with an unknown code with "" and NaN.
    direct = model.interpreter.get_signature_runner("translate_between")(
        text=np.array([text.encode() for text in sentences[:2]], dtype=object),
        source_language=np.array([b"Klingon", source.encode()], dtype=object),
        target_language=np.array([target.encode(), target.encode()], dtype=object))
    assert direct["translation"][0] == b"" and np.isnan(direct["score"][0])
    assert direct["translation"][1].decode() == made_for[1] and np.isfinite(direct["score"][1])
    for codes, message in (({"source_language": "Klingon", "target_language": target}, "must be a language code"),
                           ({"source_language": [source], "target_language": target}, "one code per text"),
                           ({"target_language": target}, "source_language is missing")):
        with pytest.raises(ValueError, match=message) as refused:
            model.translate(sentences[:2], **codes)
        assert "\n" not in str(refused.value)
    assert model.translate(sentences[:2]) == made_for  # and it serves on
    builtin = LiteRTModel(pretrained_exports / f"{name}-builtin")  # the host looks the codes' tokens up
    assert builtin.translate(sentences, source_language=sources, target_language=targets) == [
        text.decode() for text in ours["translation"].numpy()]
    with pytest.raises(ValueError, match="must be a language code"):
        builtin.translate(sentences[:1], source_language="Klingon", target_language=target)
    with pytest.raises(ValueError, match="takes no source_language"):
        LiteRTModel(pretrained_exports / "marian-shared-swish-greedy").translate(["A dog."], source_language="en",
                                                                                target_language="de")


@pytest.mark.parametrize("name", ["m2m100-en-de", "nllb-en-de"])
def test_a_bpe_model_segments_on_device_as_the_checkpoints_tokenizer(name, tmp_path):
    """LiteRT's kernel runs unigram models: a BPE model's merges run in the graph (`text.bpe_merges`)."""
    from test_pretrained import FIXTURES

    translation.import_checkpoint(str(FIXTURES / name), str(tmp_path / "run"), *PRETRAINED[name][0])
    tokenizer = translation.load_translator(str(tmp_path / "run")).source_tokenizer

    def on_device_pieces(max_pieces, texts):  # traced, as in the file
        pieces = graph_function(litert.LiteRTTokenizer(tokenizer, max_pieces).pieces, input_signature=[TEXTS])
        return pieces(tf.constant(texts)).to_list()

    texts = [source for source, _ in demo_corpus()["val"][:200]] + TOKENIZER_SENTENCES
    texts += ["  two  spaces ", "   ", " a", "a ", "naïve café 東京"]
    # The merges loop once per merge of a batch's longest word, over the whole batch: the texts of
    # 200 characters or more (a 300-letter word) go in a batch of their own (together, 9 s; apart, 0.4 s).
    short, long = [text for text in texts if len(text) < 200], [text for text in texts if len(text) >= 200]
    assert on_device_pieces(512, short) + on_device_pieces(512, long) == tokenizer.tokenize(
        tf.constant(short + long), add_start_end=False).to_list()
    # A long text's merges stop at the pieces the frame keeps: the same first pieces.
    long_texts = ["A dog runs in the park. " * 400, "x" * 3000, "Zwei junge Männer " * 100 + "y" * 2000]
    on_device = on_device_pieces(64, long_texts)
    ours = tokenizer.tokenize(tf.constant(long_texts), add_start_end=False).to_list()
    assert [row[:64] for row in on_device] == [row[:64] for row in ours]
    assert all(len(row) < 64 * 30 for row in on_device)  # cut, not merged whole


def test_a_tokenizer_litert_cannot_run_is_refused_in_one_line(tmp_path):
    """A unigram model on text split at every space (no checkpoint we import has one)."""
    from test_pretrained import FIXTURES

    from keras_transformer.text import SentencePieceTokenizer

    translation.import_checkpoint(str(FIXTURES / "marian-shared-swish"), str(tmp_path / "run"))
    marian = translation.load_translator(str(tmp_path / "run")).source_tokenizer
    settings = dataclasses.replace(marian.settings, word_by_word=True)
    tokenizer = SentencePieceTokenizer(marian.model, list(marian.checkpoint_vocab), settings)
    with pytest.raises(ValueError, match="export a SavedModel or a CTranslate2 model instead") as refused:
        litert.LiteRTTokenizer(tokenizer, 64)
    assert "\n" not in str(refused.value)


# A block larger than glibc's largest mmap threshold, freed and allocated again: without
# `keep_freed_memory_for_reuse` every allocation of it faults its pages in anew.
_FAULTS_OF_A_SECOND_BLOCK = r"""
import ctypes, resource, sys
sys.argv[0] = "keras-transformer"  # the package as the command imports it: no Keras layers (no TensorFlow) yet
from keras_transformer.on_device import keep_freed_memory_for_reuse
if sys.argv[1] == "keep":
    keep_freed_memory_for_reuse()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
size = 64 << 20
def written_and_freed():
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(ctypes.c_void_p(block))
written_and_freed()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
written_and_freed()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_memory_is_kept_for_the_next_allocation():
    """What `LiteRTModel` asks of glibc: a search's next chunk reuses the pages of the last, without faulting them in."""
    def faults(setting):
        done = subprocess.run([sys.executable, "-c", _FAULTS_OF_A_SECOND_BLOCK, setting], capture_output=True, text=True,
                              env=ENV, check=True)
        return int(done.stdout.split()[-1])

    pages = (64 << 20) // 4096
    assert faults("default") > pages // 2  # glibc hands the block back and maps it again
    assert faults("keep") < pages // 20
