"""On-device translation: the LiteRT file against our SavedModel and CTranslate2, text in and text out.

    python benchmarks/litert.py RUN_DIR [--sentences 128] [--threads 1,2] [--roads litert_int8,ctranslate2_host]
    python benchmarks/litert.py --opus-mt-base [--sentences 32] [--rounds 3]
    python benchmarks/litert.py --bpe-tokenizer [--vocab-size 32000]

Exports the run (a trained translation run: the demo's, or the Multi30k
recipe's) as a SavedModel, a CTranslate2 int8 model and LiteRT files
(float32, int8), greedy and beam 4, then runs each in a fresh process, one
at a time, on the same threads: load, the first translation, then the
first `--sentences` validation sentences at batch 1 (a phone translates a
sentence at a time) and at batch 32, each timed over two rounds (the
faster kept). Prints one JSON line per road with sentences/s, peak RSS,
seconds to the first translation, file size and BLEU against the
references; BENCHMARKS.md has the figures and the CPU they came from.
The builtin LiteRT files (`litert_builtin_*`, `--ops builtin`: the host's
tokenizer libraries around a file of builtin operators) run as a device
runs them: in `.venv-device`'s Python (no TensorFlow; `make test` builds
it), where there is one. `--roads` keeps the roads whose names start with
one of its comma-separated prefixes. The `ctranslate2_int8` roads tokenize
with our TensorFlow tokenizers (`translate --ctranslate2`); the
`ctranslate2_host` roads as CTranslate2's users do, with the `sentencepiece`
or `tokenizers` library and no TensorFlow (`ctranslate2_host.py`).
`--threads 1,2` runs every road at each count and keeps, for each batch
size, its best (`threads_b1`, `threads_b32` say which).
`--rounds N` runs every road's process N times, the roads in turn and every
other round in reverse order, and prints each figure's median, with the
rates of every round (`batch1_rounds`, `batch32_rounds`): a machine that
slows down or speeds up between processes then moves every road alike.

`--bpe-tokenizer` times the tokenizer alone, as M2M100's and NLLB's files run
it: a BPE SentencePiece model learned from Multi30k (`--vocab-size`), its
characters from LiteRT's kernel and its merges in the graph
(`text.bpe_merges`), against a unigram model of the same size, which the
kernel segments alone (Marian's case): milliseconds per sentence at batch 1
and 32.

`--opus-mt-base` times an imported checkpoint of OPUS-MT-base's shape
instead (OPUS-MT en-mg's config and tokenizer from ../shared/data, 6+6
layers, d_model 512, random weights written here with NumPy): random weights
rarely end a sentence, so every road decodes to `--max-output-length`
tokens, the same work for each; its BLEU means nothing.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
# A device's Python: no TensorFlow, no Keras (the Makefile's .venv-device).
DEVICE_PYTHON = os.path.join(HERE, "..", ".venv-device", "bin", "python")

# One road, in its own process: argv = road, path, threads, sentences file.
_ROAD = r"""
import json, sys, time
def peak_rss_mib():  # this process's own high-water mark (ru_maxrss would carry the parent's over exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
road, path, threads, sentences_file = sys.argv[1:5]
threads = int(threads)
texts = open(sentences_file, encoding="utf-8").read().split("\n")
started = time.perf_counter()
if road.startswith("litert"):
    sys.argv = ["keras-transformer"]  # as the command starts: no TensorFlow
    from keras_transformer.on_device import LiteRTModel
    model = LiteRTModel(path, num_threads=threads)
    translate = model.translate
elif road.startswith("ctranslate2_host"):  # as its users run it: the host's tokenizer library, no TensorFlow
    sys.argv = ["keras-transformer"]  # the package then loads no Keras (and so no TensorFlow)
    from ctranslate2_host import HostTokenizedCTranslate2  # benchmarks/, the process's working directory
    model = HostTokenizedCTranslate2(*path.split("|"), threads=threads)
    beam = 4 if road.endswith("beam4") else 1
    translate = lambda batch, batch_size=32: model.translate(batch, beam_size=beam)
elif road.startswith("ctranslate2"):
    from keras_transformer.export.ctranslate2 import CTranslate2Translator
    model = CTranslate2Translator(path, threads=threads)
    beam = 4 if road.endswith("beam4") else 1
    translate = lambda batch, batch_size=32: model.translate(batch, beam_size=beam)
else:
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    import tensorflow_text  # noqa: F401
    serve = tf.saved_model.load(path).signatures["serving_default"]
    translate = lambda batch, batch_size=32: [t.decode() for t in serve(text=tf.constant(batch))["translation"].numpy()]
loaded = time.perf_counter()
translate(texts[:1])
first = time.perf_counter()
def rate(batch_size):
    best = None
    for _ in range(2):
        start = time.perf_counter()
        out = [t for i in range(0, len(texts), batch_size) for t in translate(texts[i:i + batch_size])]
        seconds = time.perf_counter() - start
        best = seconds if best is None else min(best, seconds)
    return len(texts) / best, out
batch1, _ = rate(1)
batch32, translations = rate(32)
print(json.dumps({"load_s": round(loaded - started, 2), "first_s": round(first - loaded, 3),
                  "batch1": round(batch1, 2), "batch32": round(batch32, 2),
                  "peak_rss_mib": peak_rss_mib(),
                  "translations": translations, "tensorflow_imported": "tensorflow" in sys.modules}))
"""


def opus_mt_base_checkpoint(directory):
    """A Marian checkpoint directory of OPUS-MT en-mg's shape with random weights (float32 safetensors)."""
    import shutil

    import numpy as np
    from safetensors.numpy import save_file

    source = os.path.join(os.environ.get("KERAS_TRANSFORMER_DATA", os.path.join(HERE, "..", "..", "shared", "data")),
                          "opus-mt-en-mg")
    for name in ("config.json", "source.spm", "target.spm", "vocab.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(source, name), directory)
    with open(os.path.join(source, "config.json"), encoding="utf-8") as file:
        config = json.load(file)
    d, d_ff, vocab = config["d_model"], config["encoder_ffn_dim"], config["vocab_size"]
    rng = np.random.default_rng(0)
    tensors = {"model.shared.weight": rng.normal(0, 0.02, (vocab, d)), "final_logits_bias": np.zeros((1, vocab))}

    def linear(name, outputs, inputs):
        tensors[f"{name}.weight"] = rng.normal(0, 0.02, (outputs, inputs))
        tensors[f"{name}.bias"] = np.zeros(outputs)

    def norm(name):
        tensors[f"{name}.weight"], tensors[f"{name}.bias"] = np.ones(d), np.zeros(d)

    for stack, layers in (("encoder", config["encoder_layers"]), ("decoder", config["decoder_layers"])):
        for index in range(layers):
            prefix = f"model.{stack}.layers.{index}"
            for attention in ("self_attn", "encoder_attn") if stack == "decoder" else ("self_attn",):
                for projection in ("q_proj", "k_proj", "v_proj", "out_proj"):
                    linear(f"{prefix}.{attention}.{projection}", d, d)
                norm(f"{prefix}.{attention}_layer_norm")
            linear(f"{prefix}.fc1", d_ff, d)
            linear(f"{prefix}.fc2", d, d_ff)
            norm(f"{prefix}.final_layer_norm")
    save_file({name: value.astype(np.float32) for name, value in tensors.items()},
              os.path.join(directory, "model.safetensors"))
    with open(os.path.join(directory, "generation_config.json"), "w", encoding="utf-8") as file:
        json.dump({"bad_words_ids": [[config["pad_token_id"]]], "decoder_start_token_id": config["pad_token_id"],
                   "eos_token_id": config["eos_token_id"], "forced_eos_token_id": config["eos_token_id"],
                   "max_length": 512, "num_beams": 4, "pad_token_id": config["pad_token_id"]}, file)


def _size(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


def _pairs(config, count):
    """The run's first `count` validation pairs; an imported checkpoint's: Multi30k's English side, no references."""
    from keras_transformer.runs import translation

    if not config.get("pretrained"):
        return translation.load_pairs(config["data"], ("val",))["val"][:count]
    data = os.environ.get("KERAS_TRANSFORMER_DATA", os.path.join(HERE, "..", "..", "shared", "data"))
    with open(os.path.join(data, "multi30k", "val.en"), encoding="utf-8") as file:
        return [(line.rstrip("\n"), "") for line in file][:count]


def _multi30k_lines(split, language):
    data = os.environ.get("KERAS_TRANSFORMER_DATA", os.path.join(HERE, "..", "..", "shared", "data"))
    with open(os.path.join(data, "multi30k", f"{split}.{language}"), encoding="utf-8") as file:
        return [line.rstrip("\n") for line in file]


def time_tokenizers(vocab_size, sentences, threads):
    """One JSON row per SentencePiece model type: its on-device segmentation's milliseconds per sentence."""
    import time

    import numpy as np
    import tensorflow as tf
    from ai_edge_litert.interpreter import InterpreterWithCustomOps

    from keras_transformer.export import litert
    from keras_transformer.on_device import text_operator_registerers
    from keras_transformer.text import SentencePieceTokenizer

    corpus = _multi30k_lines("train", "en") + _multi30k_lines("train", "de")
    texts = np.array([line.encode() for line in _multi30k_lines("val", "en")[:sentences]], dtype=object)
    for model_type in ("unigram", "bpe"):
        tokenizer = SentencePieceTokenizer.learn(corpus, vocab_size=vocab_size, model_type=model_type)
        on_device = litert.LiteRTTokenizer(tokenizer, max_length=512)
        service = litert.LiteRTService(tf.Module(), {"framed": (lambda text: {"ids": on_device.framed(text)},
                                                                 [litert.TEXT])})
        interpreter = InterpreterWithCustomOps(model_content=litert.convert(service), num_threads=threads,
                                               custom_op_registerers=text_operator_registerers())
        runner = interpreter.get_signature_runner()
        expected = tokenizer.tokenize(tf.constant(list(texts)), add_start_end=True).to_list()
        row = {"model": model_type, "pieces": tokenizer.vocab_size - 1, "sentences": len(texts), "same_as_tensorflow": True}
        for batch_size in (1, 32):
            runner(text=texts[:batch_size])
            best, ids = None, []
            for _ in range(3):
                started, ids = time.perf_counter(), []
                for start in range(0, len(texts), batch_size):
                    ids.extend([value for value in row_ids if value] for row_ids in
                               runner(text=texts[start:start + batch_size])["ids"].tolist())
                seconds = time.perf_counter() - started
                best = seconds if best is None else min(best, seconds)
            row[f"ms_per_sentence_b{batch_size}"] = round(1000 * best / len(texts), 3)
            row["same_as_tensorflow"] &= ids == expected  # at every batch size
        print(json.dumps(row), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", nargs="?")
    parser.add_argument("--opus-mt-base", action="store_true", help="an imported checkpoint of OPUS-MT-base's shape")
    parser.add_argument("--sentences", type=int, default=128)
    parser.add_argument("--threads", default="2",
                        help="each road's thread counts, comma-separated: with more than one, each figure is the road's "
                        "best, with the count it took (`threads_b1`, `threads_b32`)")
    parser.add_argument("--rounds", type=int, default=1, help="each road's process this many times, in turn")
    parser.add_argument("--max-output-length", type=int, default=None)
    parser.add_argument("--roads", default="", help="comma-separated prefixes of the roads to run (default: all)")
    parser.add_argument("--bpe-tokenizer", action="store_true", help="the tokenizers alone: BPE against unigram")
    parser.add_argument("--vocab-size", type=int, default=32000, help="--bpe-tokenizer: the models' size")
    arguments = parser.parse_args()
    if arguments.bpe_tokenizer:
        time_tokenizers(arguments.vocab_size, arguments.sentences, arguments.threads)
        return
    if bool(arguments.run_dir) == arguments.opus_mt_base:
        parser.error("give RUN_DIR, --opus-mt-base or --bpe-tokenizer")
    if arguments.rounds < 1:
        parser.error("--rounds must be at least 1")

    import sacrebleu

    from keras_transformer.runs import translation

    with tempfile.TemporaryDirectory() as directory:
        if arguments.opus_mt_base:
            checkpoint = os.path.join(directory, "checkpoint")
            os.makedirs(checkpoint)
            opus_mt_base_checkpoint(checkpoint)
            arguments.run_dir = os.path.join(directory, "run")
            translation.import_checkpoint(checkpoint, arguments.run_dir)
        config = translation.load_config(arguments.run_dir)
        pairs = _pairs(config, arguments.sentences)
        sentences_file = os.path.join(directory, "sentences.txt")
        with open(sentences_file, "w", encoding="utf-8") as file:
            file.write("\n".join(source for source, _ in pairs))
        roads = _exported_roads(arguments, directory, [prefix for prefix in arguments.roads.split(",") if prefix])
        references = [target for _, target in pairs]
        thread_counts = [int(count) for count in arguments.threads.split(",")]
        runs = {(road, threads): [] for road in roads for threads in thread_counts}
        for round_index in range(arguments.rounds):
            for road, threads in list(runs) if round_index % 2 == 0 else list(runs)[::-1]:
                runs[road, threads].append(_run_road(road, roads[road], threads, sentences_file))
        for road, path in roads.items():
            row = _best_row({threads: _median_row(runs[road, threads]) for threads in thread_counts})
            path = path.split("|")[0]
            translations = row.pop("translations")
            size_path = os.path.join(path, "model.tflite") if road.startswith("litert") else path
            if road.startswith("saved_model"):
                size_path = os.path.join(path, "variables")
            row.update(road=road, bytes=_size(size_path))
            if any(references):
                row["bleu"] = round(sacrebleu.corpus_bleu(translations, [references]).score, 2)
            print(json.dumps(row), flush=True)


def _exported_roads(arguments, directory, prefixes):
    """`{road: its export's path}`: the roads whose names start with one of `prefixes` (all, if none), exported."""
    from keras_transformer.runs import translation

    def wanted(road):
        return not prefixes or any(road.startswith(prefix) for prefix in prefixes)

    roads = {}
    for beam in (1, 4):
        name = f"beam{beam}"
        limits = dict(beam_size=beam, max_output_length=arguments.max_output_length)
        if wanted(f"saved_model_{name}"):
            roads[f"saved_model_{name}"] = translation.export(arguments.run_dir, os.path.join(directory, f"sm{beam}"),
                                                              **limits)
        for ops, quantization in (("text", None), ("text", "int8"), ("builtin", "int8")):
            road = f"litert_{'builtin_' if ops == 'builtin' else ''}{quantization or 'float32'}_{name}"
            if wanted(road):
                path = os.path.join(directory, road)
                translation.export_litert(arguments.run_dir, path, quantization=quantization, ops=ops, **limits)
                roads[road] = path
    if wanted("ctranslate2_int8") or wanted("ctranslate2_host"):
        ct2 = translation.export_ctranslate2(arguments.run_dir, os.path.join(directory, "ct2"), quantization="int8",
                                             max_output_length=arguments.max_output_length)
    if wanted("ctranslate2_int8"):
        roads["ctranslate2_int8_beam1"] = roads["ctranslate2_int8_beam4"] = ct2
    if wanted("ctranslate2_host"):  # the host's tokenizer files: a builtin export's
        tokenizers = roads.get("litert_builtin_int8_beam1") or translation.export_litert(
            arguments.run_dir, os.path.join(directory, "tokenizers"), ops="builtin", quantization="int8",
            max_output_length=arguments.max_output_length)
        for beam in (1, 4):
            roads[f"ctranslate2_host_int8_beam{beam}"] = f"{ct2}|{tokenizers}"
    return roads


def _run_road(road, path, threads, sentences_file):
    """One road's process: its JSON row. A builtin file runs in a device's Python (no TensorFlow), where there is one."""
    python = DEVICE_PYTHON if road.startswith("litert_builtin") and os.path.exists(DEVICE_PYTHON) else sys.executable
    result = subprocess.run([python, "-c", _ROAD, road, path, str(threads), sentences_file], capture_output=True,
                            text=True, check=True, cwd=HERE)
    return json.loads(result.stdout.splitlines()[-1])


def _best_row(rows_by_threads):
    """One road's row from its rows at each thread count: each rate the best, with the count that gave it."""
    if len(rows_by_threads) == 1:
        return next(iter(rows_by_threads.values()))
    row = dict(rows_by_threads[min(rows_by_threads)])
    for rate in ("batch1", "batch32"):
        threads = max(rows_by_threads, key=lambda count: rows_by_threads[count][rate])
        row[rate], row[f"threads_{rate.replace('batch', 'b')}"] = rows_by_threads[threads][rate], threads
        row[f"{rate}_by_threads"] = {count: rows_by_threads[count][rate] for count in rows_by_threads}
    return row


def _median_row(rows):
    """One road's processes as one row: each figure's median, and with more than one, the rates of each.

    The translations are the first process's; `translations_alike` says
    whether every process gave the same.
    """
    row = dict(rows[0])
    for name, digits in (("load_s", 2), ("first_s", 3), ("batch1", 2), ("batch32", 2)):
        row[name] = round(statistics.median(each[name] for each in rows), digits)
    row["peak_rss_mib"] = int(statistics.median(each["peak_rss_mib"] for each in rows))
    if len(rows) > 1:
        row["batch1_rounds"] = [each["batch1"] for each in rows]
        row["batch32_rounds"] = [each["batch32"] for each in rows]
        row["translations_alike"] = all(each["translations"] == rows[0]["translations"] for each in rows)
    return row


if __name__ == "__main__":
    main()
