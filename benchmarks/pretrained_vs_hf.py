"""An imported OPUS-MT-base-sized checkpoint: our SavedModel against Hugging Face's `generate`, and CTranslate2.

    python benchmarks/pretrained_vs_hf.py --hf-python /path/to/venv-with-transformers/bin/python

The checkpoint is OPUS-MT en-mg's own config and tokenizer (`../shared/data/opus-mt-en-mg`: 6+6
layers, d_model 512, 8 heads, swish, 54,688 ids) with random weights, which Hugging Face writes
(`--hf-python` names an interpreter with transformers, PyTorch and, for the reference row,
CTranslate2). Random weights rarely end a sentence, so every search runs to `--max-length`: the
three do the same number of steps, which is what a speed comparison needs.

Each measurement runs in its own process, one at a time, with `--threads` intra-op threads:
1. import-hf of the checkpoint: seconds and peak resident memory against the weights' size;
2. our export (the SavedModel a server loads), greedy and beam 4: sentences per second;
3. Hugging Face's `generate` (PyTorch, float32; `--hf-dtype bfloat16` for the reference row), greedy and beam 4;
4. CTranslate2 (its own converter on the same checkpoint, float32), greedy and beam 4.
Rounds alternate (ours, theirs, ours, theirs) so that drift on a shared machine hits both; the
best round of each is reported, and the ratio within a round. Prints a JSON summary.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.environ.get("KERAS_TRANSFORMER_DATA", os.path.join(HERE, "..", "..", "shared", "data"))

MAKE_CHECKPOINT = r"""
import json, os, shutil, sys, torch, transformers
source, out, max_length = sys.argv[1], sys.argv[2], int(sys.argv[3])
config = transformers.MarianConfig.from_pretrained(source)
torch.manual_seed(0)
model = transformers.MarianMTModel(config)
model.generation_config = transformers.GenerationConfig(
    bad_words_ids=[[config.pad_token_id]], decoder_start_token_id=config.decoder_start_token_id,
    eos_token_id=config.eos_token_id, forced_eos_token_id=config.eos_token_id, max_length=max_length,
    num_beams=4, pad_token_id=config.pad_token_id)
model.save_pretrained(out)
for name in ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(source, name), out)
"""

HF_GENERATE = r"""
import json, sys, time, torch, transformers
checkpoint, sentences_path, batch_size, threads, beams = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
dtype = getattr(torch, sys.argv[6])
torch.set_num_threads(threads)
sentences = json.load(open(sentences_path))
model = transformers.MarianMTModel.from_pretrained(checkpoint, dtype=dtype).eval()
tokenizer = transformers.MarianTokenizer.from_pretrained(checkpoint)
def run():
    for start in range(0, len(sentences), batch_size):
        batch = tokenizer(sentences[start:start + batch_size], padding=True, return_tensors="pt")
        with torch.inference_mode():
            model.generate(**batch, num_beams=beams)
run_first = sentences[:batch_size]
with torch.inference_mode():
    model.generate(**tokenizer(run_first, padding=True, return_tensors="pt"), num_beams=beams)  # warm-up
started = time.perf_counter(); run(); seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "sentences_per_second": len(sentences) / seconds}))
"""

CT2 = r"""
import json, sys, time, ctranslate2, transformers
model_dir, checkpoint, sentences_path, batch_size, threads, beams, max_length = sys.argv[1:8]
batch_size, threads, beams, max_length = int(batch_size), int(threads), int(beams), int(max_length)
sentences = json.load(open(sentences_path))
tokenizer = transformers.MarianTokenizer.from_pretrained(checkpoint)
sources = [tokenizer.convert_ids_to_tokens(tokenizer(s).input_ids) for s in sentences]
translator = ctranslate2.Translator(model_dir, device="cpu", compute_type="float32", inter_threads=1, intra_threads=threads)
def run():
    translator.translate_batch(sources, beam_size=beams, max_batch_size=batch_size, max_decoding_length=max_length - 1,
                               length_penalty=1.0)
translator.translate_batch(sources[:batch_size], beam_size=beams, max_decoding_length=max_length - 1)
started = time.perf_counter(); run(); seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "sentences_per_second": len(sentences) / seconds}))
"""

OURS = r"""
import json, os, sys, time
threads = int(sys.argv[5])
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(threads)
tf.config.threading.set_inter_op_parallelism_threads(1)
import tensorflow_text  # noqa: F401
export_dir, sentences_path, batch_size, beams = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sentences = json.load(open(sentences_path))
serve = tf.saved_model.load(os.path.join(export_dir, f"beam{beams}", "1")).signatures["serving_default"]
def run():
    for start in range(0, len(sentences), batch_size):
        serve(text=tf.constant(sentences[start:start + batch_size]))
serve(text=tf.constant(sentences[:batch_size]))  # warm-up: the first call traces nothing, but loads kernels
started = time.perf_counter(); run(); seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "sentences_per_second": len(sentences) / seconds}))
"""

IMPORT = r"""
import json, os, resource, sys, time
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # as `keras-transformer import-hf` starts TensorFlow
started = time.perf_counter()
from keras_transformer.runs import translation
imported = time.perf_counter()
translation.import_checkpoint(sys.argv[1], sys.argv[2])
print(json.dumps({"seconds": time.perf_counter() - imported, "with_start": time.perf_counter() - started,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_json(command):
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{command[:3]} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf-python", default=sys.executable, help="a Python with transformers, torch, ctranslate2")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=48, help="generate's max_length (the start token counts)")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hf-dtype", choices=("float32", "bfloat16"), default="float32",
                        help="Hugging Face's weights and arithmetic (ours stay float32: bfloat16 is a reference row)")
    parser.add_argument("--work", default=None, help="where the checkpoint, run and exports go (default: a temp dir); "
                        "a checkpoint, exports and CTranslate2 model already there are reused")
    arguments = parser.parse_args()
    work = arguments.work or tempfile.mkdtemp(prefix="pretrained-bench-")
    os.makedirs(work, exist_ok=True)
    checkpoint, run_dir = os.path.join(work, "checkpoint"), os.path.join(work, "run")
    sentences = open(os.path.join(DATA, "multi30k", "val.en"), encoding="utf-8").read().splitlines()[: arguments.sentences]
    sentences_path = os.path.join(work, "sentences.json")
    with open(sentences_path, "w", encoding="utf-8") as file:
        json.dump(sentences, file)
    if not os.path.exists(checkpoint):
        subprocess.run([arguments.hf_python, "-c", MAKE_CHECKPOINT, os.path.join(DATA, "opus-mt-en-mg"), checkpoint,
                        str(arguments.max_length)], check=True, capture_output=True)
    weights_mib = os.path.getsize(os.path.join(checkpoint, "model.safetensors")) / 2**20
    summary = {"hf_dtype": arguments.hf_dtype, "threads": arguments.threads, "sentences": len(sentences),
               "batch_size": arguments.batch_size, "max_length": arguments.max_length, "weights_mib": round(weights_mib)}
    if os.path.exists(run_dir):
        subprocess.run(["rm", "-rf", run_dir], check=True)
    summary["import"] = run_json([sys.executable, "-c", IMPORT, checkpoint, run_dir])
    exports = os.path.join(work, "exports")
    for beams in (1, 4):
        if not os.path.exists(os.path.join(exports, f"beam{beams}")):
            from keras_transformer.runs import translation

            translation.export(run_dir, os.path.join(exports, f"beam{beams}"), beam_size=beams)
    ct2_dir = os.path.join(work, "ct2")
    if not os.path.exists(ct2_dir):
        subprocess.run([os.path.join(os.path.dirname(arguments.hf_python), "ct2-transformers-converter"), "--model",
                        checkpoint, "--output_dir", ct2_dir], check=True, capture_output=True)
    common = [sentences_path, arguments.batch_size]
    for beams, name in ((1, "greedy"), (4, "beam4")):
        rounds = []
        for _ in range(arguments.rounds):
            ours = run_json([sys.executable, "-c", OURS, exports, *common, beams, arguments.threads])
            theirs = run_json([arguments.hf_python, "-c", HF_GENERATE, checkpoint, *common, arguments.threads, beams,
                               arguments.hf_dtype])
            rounds.append({"ours": ours["sentences_per_second"], "hf": theirs["sentences_per_second"],
                           "ratio": ours["sentences_per_second"] / theirs["sentences_per_second"]})
        ct2 = run_json([arguments.hf_python, "-c", CT2, ct2_dir, checkpoint, *common, arguments.threads, beams,
                        arguments.max_length])
        summary[name] = {"rounds": rounds, "ours_best": max(r["ours"] for r in rounds),
                         "hf_best": max(r["hf"] for r in rounds), "ctranslate2": ct2["sentences_per_second"]}
        summary[name]["ratio_best"] = summary[name]["ours_best"] / summary[name]["hf_best"]
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
