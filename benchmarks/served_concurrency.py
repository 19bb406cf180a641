"""Served throughput under concurrency: the exported SavedModel against the CTranslate2 export, at beam 4.

    python benchmarks/served_concurrency.py RUN_DIR [--clients 1 4 8] [--request-sizes 1 8 32] [--requests 6]

A server holds one loaded model and answers many clients at once. This
benchmark does the same in one process: the run is exported both ways
(`export_translator`, `export_ctranslate2`, into a temporary directory),
each is loaded once, and for every number of clients N and request size k,
N threads each send `--requests` requests of k validation sentences, one
after the other, all N at once. Reported per row: sentences per second over
the whole row (all clients' sentences / wall time) and the p50 and p99
latency of a request. Both sides get the machine's cores: TensorFlow its
default thread pools, CTranslate2 one translator with `intra_threads` =
cores (`inter_threads` 1: batches queue, as in its server). Rows alternate
between the two. Prints one JSON object per row and a summary table.
"""

import argparse
import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def run_row(translate, sentences, clients, request_size, requests):
    """`(sentences/s, p50 s, p99 s)` of `clients` threads each sending `requests` requests of `request_size`."""
    latencies = []
    lock = threading.Lock()

    def client(index):
        for number in range(requests):
            start = (index * requests + number) * request_size % max(1, len(sentences) - request_size)
            batch = sentences[start : start + request_size]
            began = time.perf_counter()
            translate(batch)
            with lock:
                latencies.append(time.perf_counter() - began)

    threads = [threading.Thread(target=client, args=(index,)) for index in range(clients)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    return clients * requests * request_size / wall, percentile(latencies, 0.5), percentile(latencies, 0.99)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--request-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=6, help="requests per client per row")
    parser.add_argument("--beam-size", type=int, default=4)
    arguments = parser.parse_args()

    import tensorflow as tf

    from keras_transformer.export import CTranslate2Translator, export_ctranslate2, export_translator, load_export
    from keras_transformer.runs import translation

    translator = translation.load_translator(arguments.run_dir, beam_size=arguments.beam_size)
    pairs = translation.load_pairs(translation.load_config(arguments.run_dir)["data"], ("val",))["val"]
    sentences = [source for source, _ in pairs[:400]]
    cores = os.cpu_count()
    with tempfile.TemporaryDirectory() as work:
        serve = load_export(export_translator(translator, os.path.join(work, "saved_model"))).signatures[
            "serving_default"
        ]
        converted = CTranslate2Translator(export_ctranslate2(translator, os.path.join(work, "ct2")), threads=cores)
        contenders = {
            "saved_model": lambda batch: serve(text=tf.constant(batch))["translation"].numpy(),
            "ctranslate2_float32": lambda batch: converted.translate(batch, beam_size=arguments.beam_size),
        }
        for translate in contenders.values():
            translate(sentences[:8])  # warm-up: tracing, loading
        summary = []
        for clients in arguments.clients:
            for request_size in arguments.request_sizes:
                row = {"clients": clients, "request_size": request_size}
                for name in (list(contenders) if len(summary) % 2 == 0 else list(contenders)[::-1]):
                    rate, p50, p99 = run_row(contenders[name], sentences, clients, request_size, arguments.requests)
                    row[name] = {"sentences_per_second": round(rate, 1), "p50_s": round(p50, 3),
                                 "p99_s": round(p99, 3)}
                row["saved_model / ctranslate2"] = round(
                    row["saved_model"]["sentences_per_second"] / row["ctranslate2_float32"]["sentences_per_second"], 2
                )
                print(json.dumps(row), flush=True)
                summary.append(row)
    print("| clients | sentences a request | SavedModel sentences/s (p50 / p99 s) | CTranslate2 float32 "
          "sentences/s (p50 / p99 s) | ratio |")
    print("|---|---|---|---|---|")
    for row in summary:
        ours, theirs = row["saved_model"], row["ctranslate2_float32"]
        print(f"| {row['clients']} | {row['request_size']} | {ours['sentences_per_second']} ({ours['p50_s']} / "
              f"{ours['p99_s']}) | {theirs['sentences_per_second']} ({theirs['p50_s']} / {theirs['p99_s']}) | "
              f"{row['saved_model / ctranslate2']} |")


if __name__ == "__main__":
    main()
