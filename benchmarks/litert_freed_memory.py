"""What `LiteRTModel(keep_freed_memory=...)` changes: speed, page faults and peak memory of a LiteRT file.

    python benchmarks/litert_freed_memory.py EXPORT_DIR [--sentences 64] [--batch-size 32] [--threads 2]

LiteRT frees the memory of a loop's body each time the loop ends, and the
searches run a loop per chunk of steps; glibc hands large blocks back to the
system, and the next chunk faults them in again (`on_device.keep_freed_memory_for_reuse`).
The setting is for the whole process, so each one runs in a process of its
own, one after the other: a warm-up batch, then 2 rounds over the first
`--sentences` Multi30k validation sentences, with the export's own search
(greedy or beam: a file each). Prints one JSON line per
setting: sentences/s (the faster round), the minor page faults of that
round, and the process's peak RSS.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DATA_DIR = os.environ.get("KERAS_TRANSFORMER_DATA", os.path.join(HERE, "..", "..", "shared", "data"))

# One setting, in its own process: argv = directory, keep (0 or 1), threads, batch size, sentences file.
_RUN = r"""
import json, resource, sys, time
directory, keep, threads, batch_size, sentences_file = sys.argv[1:6]
batch_size = int(batch_size)
texts = open(sentences_file, encoding="utf-8").read().split("\n")
sys.argv = ["keras-transformer"]
from keras_transformer.on_device import LiteRTModel
model = LiteRTModel(directory, num_threads=int(threads), keep_freed_memory=keep == "1")
model.translate(texts[:batch_size])
rounds = []
for _ in range(2):
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    for i in range(0, len(texts), batch_size):
        model.translate(texts[i:i + batch_size])
    seconds = time.perf_counter() - start
    rounds.append((len(texts) / seconds, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults))
rate, faults = max(rounds)
peak = next(int(line.split()[1]) // 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"keep_freed_memory": keep == "1", "sentences_per_s": round(rate, 2), "minor_page_faults": faults,
                  "peak_rss_mib": peak}))
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    source = os.path.join(DATA_DIR, "multi30k", "val.en")
    with open(source, encoding="utf-8") as file:
        texts = [line.rstrip("\n") for line in file][: args.sentences]
    if not os.path.isfile(os.path.join(args.export_dir, "model.tflite")):
        sys.exit(f"{args.export_dir} is not a LiteRT export (keras-transformer export RUN_DIR OUT --format litert)")
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt", delete=False) as file:
        file.write("\n".join(texts))
        sentences_file = file.name
    try:
        for keep in ("0", "1"):
            finished = subprocess.run([sys.executable, "-c", _RUN, args.export_dir, keep, str(args.threads),
                                       str(args.batch_size), sentences_file], capture_output=True, text=True)
            lines = finished.stdout.strip().splitlines()
            if finished.returncode != 0 or not lines:
                why = (finished.stderr.strip().splitlines() or [f"exit status {finished.returncode}"])[-1]
                sys.exit(f"the run with keep_freed_memory={keep == '1'} failed: {why}")
            print(json.dumps({"export": args.export_dir, **json.loads(lines[-1])}))
    finally:
        os.remove(sentences_file)


if __name__ == "__main__":
    main()
