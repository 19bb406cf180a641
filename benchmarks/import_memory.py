"""Resident memory of `import-hf` (or `export --format hf`), phase by phase, against the checkpoint's weights.

    python benchmarks/import_memory.py CHECKPOINT_DIR [--work DIR]
    python benchmarks/import_memory.py --export RUN_DIR [--work DIR]

CHECKPOINT_DIR: a Hugging Face checkpoint with `model.safetensors` (benchmarks/pretrained_vs_hf.py
writes an OPUS-MT-base-sized one under its `--work` directory). TensorFlow starts as
`keras-transformer import-hf` starts it (oneDNN off). A thread samples the resident set every 5 ms
(`/proc/self/statm`, Linux); each phase's peak is reported over the memory held once TensorFlow and
Keras are imported, and the largest as a multiple of the weights file's size. Prints one JSON line.
With --export, the run (an imported one, say) is exported as a Hugging Face checkpoint instead:
loading the model, then writing it.
"""

import argparse
import json
import os
import tempfile
import threading
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # as `keras-transformer import-hf` starts TensorFlow


def resident_mib():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint_dir", nargs="?")
    parser.add_argument("--export", metavar="RUN_DIR", help="measure `export --format hf` of this run instead")
    parser.add_argument("--work", default=None, help="where the run is written (default: a temporary directory)")
    arguments = parser.parse_args()
    if bool(arguments.checkpoint_dir) == bool(arguments.export):
        parser.error("give a CHECKPOINT_DIR or --export RUN_DIR")

    phase, peaks = ["start"], {}

    def sample():
        while True:
            peaks[phase[0]] = max(peaks.get(phase[0], 0.0), resident_mib())
            time.sleep(0.005)

    threading.Thread(target=sample, daemon=True).start()
    from keras_transformer import pretrained, saving
    from keras_transformer.runs import translation

    time.sleep(0.1)
    baseline = resident_mib()
    load, save = pretrained.load, saving.save_model

    def timed_load(*args, **kwargs):
        phase[0] = "load"
        result = load(*args, **kwargs)
        phase[0] = "between"
        return result

    def timed_save(*args, **kwargs):
        phase[0] = "save"
        result = save(*args, **kwargs)
        phase[0] = "after"
        return result

    work = arguments.work or tempfile.mkdtemp(prefix="import-memory-")
    if arguments.export:
        from keras_transformer.pretrained import publish

        write = publish.write_weights

        def timed_write(*args, **kwargs):
            phase[0] = "write"
            return write(*args, **kwargs)

        publish.write_weights = timed_write  # looked up when the export writes
        phase[0] = "load"
        out = os.path.join(work, "exported")
        started = time.perf_counter()
        translation.export_hf(arguments.export, out)
        seconds = time.perf_counter() - started
        phase[0] = "after"
    else:
        pretrained.load, saving.save_model = timed_load, timed_save  # import_checkpoint looks both up when called
        out = arguments.checkpoint_dir
        started = time.perf_counter()
        translation.import_checkpoint(arguments.checkpoint_dir, os.path.join(work, "run"))
        seconds = time.perf_counter() - started
    time.sleep(0.1)
    weights = os.path.getsize(os.path.join(out, "model.safetensors")) / 2**20
    over = {name: round(peak - baseline) for name, peak in peaks.items() if name not in ("start",)}
    print(json.dumps({"seconds": round(seconds, 1), "baseline_mib": round(baseline), "weights_mib": round(weights),
                      "peak_over_baseline_mib": over, "times_the_weights": round(max(over.values()) / weights, 2)}))


if __name__ == "__main__":
    main()
