"""`make bench`: every benchmark row, side by side in one run, written to BENCHMARKS.md.

    python benchmarks/suite.py [--out BENCHMARKS.md] [--only train|decode|roofline] [--quick]

Each row runs in its own process (`rows.py`), so that each one's peak
memory is its own. The rows of a group (training; training with XLA;
decoding) start together and warm up, then time their windows in rounds:
every row one window, one row at a time, then the next round. So the
machine's drift over minutes (it is shared) spreads over all rows alike
instead of favouring whichever row ran in a fast stretch. The
results replace the part of BENCHMARKS.md between the two `make bench`
markers (the rest of the file is kept), and go to `benchmarks/results.json`
in full. `--quick` times one short window per row: for trying the suite
out, not for figures.
"""

import argparse
import concurrent.futures
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from config import KERAS_CONTENDERS, SMALL, training_flops_per_batch

HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- make bench: begin -->", "<!-- make bench: end -->"
BASELINE = ("keras_hub", "float32", False)


def training_groups(torch_available):
    """Training rows in two groups: without XLA (and PyTorch), then with XLA."""
    groups = []
    for jit in (False, True):
        group = []
        for model in KERAS_CONTENDERS:
            for dtype in ("float32", "bfloat16"):
                group.append(["train", "--model", model, "--dtype", dtype] + (["--jit"] if jit else []))
        if not jit:
            # Layers only: ours compiled with Keras' Adam and loss, as keras-hub's rows are.
            group.append(["train", "--model", "keras_transformer", "--dtype", "float32", "--stock"])
        if torch_available and not jit:
            group += [["train", "--model", "torch", "--dtype", dtype] for dtype in ("float32", "bfloat16")]
        groups.append(group)
    return groups


DECODING_ROWS = [
    ["decode", "--model", "keras_transformer", "--search", "greedy"],
    ["decode", "--model", "keras_transformer", "--search", "greedy", "--jit"],
    ["decode", "--model", "keras_transformer", "--search", "greedy", "--no-cache"],
    ["decode", "--model", "keras_transformer", "--search", "beam", "--beam-size", "4"],
    ["decode", "--model", "keras_hub", "--search", "greedy"],
    ["decode", "--model", "keras_hub", "--search", "greedy", "--jit"],
    ["decode", "--model", "keras_hub", "--search", "greedy", "--driver", "while_loop"],
    ["decode", "--model", "keras_hub", "--search", "greedy", "--driver", "while_loop", "--jit"],
]

# Rows start (import, build, trace, warm up) this many at a time, while no
# row is being timed: start-up is mostly one Python thread per process, so
# one more process than there are cores keeps the cores busy.
PARALLEL_STARTS = max(1, min(3, (os.cpu_count() or 1) + 1))


def cpu_times():
    """(stolen, total) CPU time of this machine so far, in clock ticks, from /proc/stat.

    "Stolen" is time this virtual machine's CPUs were ready to run but the
    host ran another machine: on a shared host it is the noise in a window.
    (0, 0) where /proc/stat is missing.
    """
    try:
        first_line = Path("/proc/stat").read_text().splitlines()[0]
    except (OSError, IndexError):
        return 0, 0
    # user nice system idle iowait irq softirq steal (guest time is inside user)
    ticks = [int(value) for value in first_line.split()[1:9]]
    return (ticks[7] if len(ticks) == 8 else 0), sum(ticks)


def stolen_share(before, after):
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else 0.0


def has_module(name):
    try:
        importlib.metadata.version(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def run_row(arguments, timing=()):
    """One row start to finish in its own process (the roofline)."""
    command = [sys.executable, str(HERE / "rows.py"), *arguments, *timing]
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, cwd=HERE)
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if completed.returncode != 0 or not lines:
        tail = "\n".join(completed.stderr.strip().splitlines()[-15:])
        print(f"  FAILED ({completed.returncode}): {' '.join(arguments)}\n{tail}", file=sys.stderr)
        return {"failed": " ".join(arguments), "error": tail.splitlines()[-1] if tail else ""}
    row = json.loads(lines[-1])
    row["wall_seconds"] = time.perf_counter() - started
    return row


class ConductedRow:
    """A row's process, kept alive so that it can time one window when told (`rows.py --conducted`)."""

    def __init__(self, arguments, window_seconds):
        self.arguments = arguments
        self.window_seconds = window_seconds
        self.error = None
        self.process = None
        self.stolen = []  # the host's share of this machine's CPU time during each window

    @property
    def name(self):
        return " ".join(self.arguments)

    def start(self):
        """Start the process and wait until it has warmed up; False if it failed."""
        self.started = time.perf_counter()
        self.stderr = tempfile.TemporaryFile(mode="w+")  # TensorFlow logs a lot: a pipe could fill and block it
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "rows.py"), *self.arguments, "--conducted", "--window-seconds", str(self.window_seconds)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True, cwd=HERE,
        )
        return self._expect("ready") is not None

    def _expect(self, key):
        """The next `BENCH` report's `key`; None (and the error noted) if the process ended instead."""
        for line in self.process.stdout:
            if line.startswith("BENCH "):
                return json.loads(line[len("BENCH "):])[key]
        self._failed()
        return None

    def _failed(self):
        self.process.wait()
        self.stderr.seek(0)
        tail = "\n".join(self.stderr.read().strip().splitlines()[-15:])
        self.error = f"exit {self.process.returncode}: " + (tail.splitlines()[-1] if tail else "no output")
        print(f"  FAILED: {self.name}\n{tail}", file=sys.stderr)

    def window(self):
        before = cpu_times()
        self.process.stdin.write("window\n")
        self.process.stdin.flush()
        rate = self._expect("window_rate")
        self.stolen.append(stolen_share(before, cpu_times()))
        return rate

    def finish(self):
        """Ends the process; returns its result row."""
        if self.error is None:
            self.process.stdin.write("finish\n")
            self.process.stdin.flush()
            output, _ = self.process.communicate()
            lines = [line for line in output.splitlines() if line.startswith("{")]
            if self.process.returncode == 0 and lines:
                row = json.loads(lines[-1])
                row["wall_seconds"] = time.perf_counter() - self.started
                row["window_stolen"] = self.stolen
                return row
            self._failed()
        return {"failed": self.name, "error": self.error}


def run_group(plan, windows, window_seconds, phases):
    """Every row of `plan` alive at once, timing `windows` rounds of one window each, in turn.

    The order rotates from round to round, so no row always follows the same
    one. Only one row computes at a time while windows are timed. Adds the
    seconds spent starting, timing and ending the rows to `phases`.
    """
    rows = [ConductedRow(arguments, window_seconds) for arguments in plan]
    print(f"  starting {len(rows)} rows, {PARALLEL_STARTS} at a time", flush=True)
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(PARALLEL_STARTS) as pool:
        list(pool.map(lambda row: row.start(), rows))
    warm = time.perf_counter()
    print(f"  all started and warm in {warm - started:.0f} s", flush=True)
    for round_index in range(windows):
        order = rows[round_index % len(rows):] + rows[: round_index % len(rows)]
        for row in order:
            if row.error is None:
                rate = row.window()
                if rate is not None:
                    print(f"  round {round_index + 1}: {row.name}: {rate:,.1f}/s ({row.stolen[-1]:.0%} stolen)", flush=True)
    timed = time.perf_counter()
    # Tearing TensorFlow down takes seconds per process: end them all at once.
    with concurrent.futures.ThreadPoolExecutor(len(rows)) as pool:
        results = list(pool.map(lambda row: row.finish(), rows))
    ended = time.perf_counter()
    print(f"  windows {timed - warm:.0f} s, ending the rows {ended - timed:.0f} s", flush=True)
    for phase, seconds in (("starting rows", warm - started), ("timing windows", timed - warm), ("ending rows", ended - timed)):
        phases[phase] = phases.get(phase, 0.0) + seconds
    return results


def versions():
    names = ["tensorflow", "keras", "keras-hub", "tensorflow-text", "numpy", "torch"]
    found = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    found["python"] = platform.python_version()
    return found


def machine():
    model, flags = platform.processor() or "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    features = [name for flag, name in (("avx512f", "AVX-512"), ("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16")) if flag in flags]
    memory = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f", {kib / 2**20:.0f} GiB memory"
    except (OSError, ValueError, IndexError):
        pass
    return f"{model}, {os.cpu_count()} cores ({', '.join(features) or 'no AVX-512'}){memory}, no GPU"


# -- the report --------------------------------------------------------------

LABELS = {
    "keras_transformer": "keras_transformer `Transformer`",
    "keras_hub": "keras-hub layers",
    "tutorial": "TF-tutorial style (`keras.layers.MultiHeadAttention`)",
    "torch": "PyTorch `nn.Transformer` (eager)",
}


def _peak(roofline, dtype):
    figures = [entry["gflops"] for key, entry in roofline["matmuls"].items() if key.startswith(dtype + "/")]
    return max(figures) if figures else None


def _stolen(row):
    """The host's mean share of the CPU during the row's windows, as a table cell."""
    shares = row.get("window_stolen")
    return f"{100 * sum(shares) / len(shares):.0f}%" if shares else "n/a"


def render(results, header):
    train = [row for row in results if row.get("kind") == "train"]
    decode = [row for row in results if row.get("kind") == "decode"]
    roofline = next((row for row in results if row.get("kind") == "roofline"), None)
    failed = [row for row in results if "failed" in row]
    baseline = next(
        (row for row in train if (row["model"], row["dtype"], row["jit"]) == BASELINE and not row.get("stock")), None
    )
    lines = [BEGIN, "", "## Training and decoding speed (`make bench`)", ""]
    lines += [f"- **{key}**: {value}" for key, value in header.items()]
    lines += [""]

    if train:
        lines += [
            "### Training throughput",
            "",
            'The "small" configuration: vocabularies 8000/8000, d_model 256, 3 + 3 layers, 8 heads, d_ff 512,',
            "dropout 0.1, batches of 64 sentences x 32 source x 32 target tokens (random ids, no padding),",
            "Adam, cross-entropy on float32 logits. Target tokens per second in steady state: the first steps",
            "(tracing, compilation) are excluded, then the median of 3 windows of at least 10 s, timed in",
            "rounds: each row of a group (without XLA and PyTorch; with XLA) times one window, one row at a",
            "time, every round. Model",
            "GFLOP/s counts matmul FLOPs only (formula below); \"% of peak\" divides it by the best matmul",
            "GFLOP/s this machine reached at the model's own shapes in the same dtype (roofline table).",
            '"CPU stolen" is the share of this virtual machine\'s CPU time that the host gave to other machines',
            "during the row's windows (steal time in /proc/stat): the noise the row was timed through.",
            "",
            "| model | dtype | jit_compile | tokens/s | vs keras-hub float32 | model GFLOP/s | % of matmul peak | CPU stolen | peak memory (MiB) | optimizer, loss |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in train:
            peak = _peak(roofline, row["dtype"]) if roofline else None
            ratio = f"{row['tokens_per_s'] / baseline['tokens_per_s']:.2f}x" if baseline else "n/a"
            share = f"{100 * row['model_gflops'] / peak:.0f}%" if peak else "n/a"
            optimizer = {
                "keras_transformer": "`FusedAdam`, `MaskedSparseCrossEntropy` (ours)" if not row.get("stock") else
                "`keras.optimizers.Adam`, `SparseCategoricalCrossentropy` (layers only)",
                "torch": "`torch.optim.Adam`, `cross_entropy`",
            }.get(row["model"], "`keras.optimizers.Adam`, `SparseCategoricalCrossentropy`")
            jit = "n/a (eager)" if row["model"] == "torch" else ("yes" if row["jit"] else "no")
            dtype = row["dtype"] if row["dtype"] == "float32" else (
                "bfloat16 autocast" if row["model"] == "torch" else "mixed_bfloat16"
            )
            lines.append(
                f"| {LABELS[row['model']]} | {dtype} | {jit} | {row['tokens_per_s']:,.0f} | {ratio} | "
                f"{row['model_gflops']:.0f} | {share} | {_stolen(row)} | {row['peak_memory_mib']:,.0f} | {optimizer} |"
            )
        lines += [
            "",
            f"FLOPs per training step ({training_flops_per_batch(SMALL) / 1e9:.1f} GFLOP) = 3 x forward matmul FLOPs",
            "(the backward pass is twice the forward), with d = d_model, f = d_ff, S = T = 32, V = 8000, per",
            "sentence: encoder layer S(4d^2 + 2df) + 2S^2 d; decoder layer T(4d^2 + 2df) + 2T^2 d + 2Td^2 +",
            "2Sd^2 + 2TSd; output layer TdV; FLOPs = 2 x multiply-adds (`benchmarks/contenders.py`).",
            "",
        ]

    if decode:
        keras_hub_cached = next(
            (row for row in decode if row["model"] == "keras_hub" and not row["jit"] and row.get("driver") == "while_loop"),
            None,
        )
        lines += [
            "### Decoding throughput",
            "",
            "Greedy decoding of a batch of 32 random source sentences of 32 tokens, exactly 32 new tokens",
            "each (the end token is never produced), float32, untrained weights; sentences per second, median",
            "of 3 windows of at least 5 s after warm-up, timed in rounds as above. Beam search keeps its default of also following the",
            "greedy path (so it never returns a worse-scoring translation than greedy).",
            "",
            "| decoder | search | key/value cache | jit_compile | sentences/s | vs keras-hub cached (`tf.while_loop`, no XLA) | CPU stolen | peak memory (MiB) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in decode:
            search = "greedy" if row["search"] == "greedy" else "beam 4"
            ratio = (
                f"{row['sentences_per_s'] / keras_hub_cached['sentences_per_s']:.2f}x" if keras_hub_cached else "n/a"
            )
            name = "keras_transformer `greedy_search`/`beam_search`" if row["model"] == "keras_transformer" else (
                "keras-hub `TransformerDecoder` cache + "
                + ("`GreedySampler`" if row.get("driver") == "sampler" else "plain `tf.while_loop`")
            )
            lines.append(
                f"| {name} | {search} | {'yes' if row['cache'] else 'no (recompute the prefix)'} | "
                f"{'yes' if row['jit'] else 'no'} | {row['sentences_per_s']:.1f} | {ratio} | {_stolen(row)} | {row['peak_memory_mib']:,.0f} |"
            )
        lines.append("")

    if roofline:
        lines += [
            "### The roofline: this machine's matmul speed",
            "",
            "`tf.matmul` of the model's own shapes (m x k by k x n), median of 5 timings of ~20 GFLOP each;"
            + (" measured at the start and the end of the run, the better figure kept." if roofline.get("measurements", 1) > 1 else " measured once, at the start of the run."),
            "",
            "| matmul | m x k x n | float32 GFLOP/s | bfloat16 GFLOP/s |",
            "|---|---|---|---|",
        ]
        names = sorted({key.split("/", 1)[1] for key in roofline["matmuls"]}, key=lambda n: -roofline["matmuls"][f"float32/{n}"]["shape"][2])
        for name in names:
            fp32, bf16 = roofline["matmuls"][f"float32/{name}"], roofline["matmuls"][f"bfloat16/{name}"]
            shape = " x ".join(str(size) for size in fp32["shape"])
            lines.append(f"| {name} | {shape} | {fp32['gflops']:.0f} | {bf16['gflops']:.0f} |")
        lines.append("")

    lines += goals(train, decode, roofline)
    if failed:
        lines += ["### Rows that failed", ""] + [f"- `{row['failed']}`: {row['error']}" for row in failed] + [""]
    lines.append(END)
    return "\n".join(lines)


def goals(train, decode, roofline):
    def find(rows, **match):
        return next((row for row in rows if all(row.get(key) == value for key, value in match.items())), None)

    def per_round(numerator, denominator):
        """The ratio in each round: windows of one round were timed minutes apart at most."""
        pairs = zip(numerator.get("window_rates", []), denominator.get("window_rates", []))
        return " / ".join(f"{top / bottom:.2f}" for top, bottom in pairs) or "n/a"

    keras_hub = find(train, model="keras_hub", dtype="float32", jit=False)
    ours32 = find(train, model="keras_transformer", dtype="float32", jit=False, stock=False)
    ours16 = find(train, model="keras_transformer", dtype="bfloat16", jit=False, stock=False)
    layers_only = find(train, model="keras_transformer", dtype="float32", jit=False, stock=True)
    checks = []
    if keras_hub and ours32:
        ratio = ours32["tokens_per_s"] / keras_hub["tokens_per_s"]
        checks.append(("Training float32 >= 1.25x the keras-hub model", f"{ratio:.2f}x", per_round(ours32, keras_hub), ratio >= 1.25))
    if ours32 and roofline:
        share = ours32["model_gflops"] / _peak(roofline, "float32")
        checks.append(("Training float32 >= 55% of the float32 matmul peak", f"{share:.0%}", "n/a", share >= 0.55))
    if keras_hub and ours16:
        ratio = ours16["tokens_per_s"] / keras_hub["tokens_per_s"]
        checks.append(("Training mixed bfloat16 >= 2x the keras-hub model's float32", f"{ratio:.2f}x", per_round(ours16, keras_hub), ratio >= 2))
    if keras_hub and layers_only:
        ratio = layers_only["tokens_per_s"] / keras_hub["tokens_per_s"]
        checks.append(("Layers only (both with Keras' Adam and loss), float32 >= 1.1x", f"{ratio:.2f}x", per_round(layers_only, keras_hub), ratio >= 1.1))
    cached = find(decode, model="keras_transformer", search="greedy", cache=True, jit=False)
    cached_xla = find(decode, model="keras_transformer", search="greedy", cache=True, jit=True)
    recompute = find(decode, model="keras_transformer", search="greedy", cache=False)
    hub = find(decode, model="keras_hub", jit=False, driver="while_loop")
    hub_xla = find(decode, model="keras_hub", jit=True, driver="while_loop")
    if cached and hub:
        ratio = cached["sentences_per_s"] / hub["sentences_per_s"]
        checks.append(("Cached greedy >= 2x keras-hub's cached in a `tf.while_loop` (both without XLA)", f"{ratio:.2f}x", per_round(cached, hub), ratio >= 2))
    if cached_xla and hub_xla:
        ratio = cached_xla["sentences_per_s"] / hub_xla["sentences_per_s"]
        checks.append(("Cached greedy >= 1.5x keras-hub's cached in a `tf.while_loop` (both with XLA)", f"{ratio:.2f}x", per_round(cached_xla, hub_xla), ratio >= 1.5))
    if cached and recompute:
        ratio = cached["sentences_per_s"] / recompute["sentences_per_s"]
        checks.append(("Cached greedy >= 5x our own no-cache recompute", f"{ratio:.1f}x", per_round(cached, recompute), ratio >= 5))
    if not checks:
        return []
    lines = [
        "### Goals, as ratios from this run",
        "",
        "The ratio of the medians, and the ratio within each round (how much the machine's drift moves it).",
        "",
        "| goal | measured | per round | met |",
        "|---|---|---|---|",
    ]
    lines += [f"| {goal} | {value} | {rounds} | {'yes' if met else '**no**'} |" for goal, value, rounds, met in checks]
    return lines + [""]


def merge_rooflines(results):
    """One roofline row: the best GFLOP/s per matmul over every roofline measurement."""
    rooflines = [row for row in results if row.get("kind") == "roofline"]
    if len(rooflines) < 2:
        return results
    merged = {"kind": "roofline", "matmuls": {}, "measurements": len(rooflines)}
    for row in rooflines:
        for key, entry in row["matmuls"].items():
            if key not in merged["matmuls"] or entry["gflops"] > merged["matmuls"][key]["gflops"]:
                merged["matmuls"][key] = entry
    merged["peak_memory_mib"] = max(row["peak_memory_mib"] for row in rooflines)
    return [row for row in results if row.get("kind") != "roofline"] + [merged]


def write_report(path, text):
    path = Path(path)
    existing = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    if BEGIN in existing and END in existing:
        before, rest = existing.split(BEGIN, 1)
        after = rest.split(END, 1)[1]
        updated = before + text + after
    else:
        updated = existing.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(updated, encoding="utf-8")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(HERE.parent / "BENCHMARKS.md"))
    parser.add_argument("--results", default=str(HERE / "results.json"))
    parser.add_argument("--only", choices=["train", "decode", "roofline"])
    parser.add_argument("--quick", action="store_true", help="one 2 s window per row: a smoke run, not figures")
    args = parser.parse_args()

    torch_available = has_module("torch")
    groups = []
    if args.only in (None, "train"):
        groups += [("train", group) for group in training_groups(torch_available)]
    if args.only in (None, "decode"):
        groups.append(("decode", DECODING_ROWS))
    windows = 1 if args.quick else 3
    window_seconds = {"train": 2 if args.quick else 10, "decode": 2 if args.quick else 5}

    started = time.perf_counter()
    results, phases = [], {}

    def roofline():
        roofline_started = time.perf_counter()
        results.append(run_row(["roofline"]))
        phases["roofline"] = phases.get("roofline", 0.0) + time.perf_counter() - roofline_started

    if args.only in (None, "roofline"):
        print("roofline", flush=True)
        roofline()
    for index, (kind, plan) in enumerate(groups, 1):
        print(f"[group {index}/{len(groups)}] {len(plan)} {kind} rows", flush=True)
        results += run_group(plan, windows, window_seconds[kind], phases)
    if args.only is None:
        # The machine's speed drifts over a run; the roofline is taken at both
        # ends and the better figure kept, so "% of peak" is not flattered.
        print("roofline again", flush=True)
        roofline()
    minutes = (time.perf_counter() - started) / 60
    results = merge_rooflines(results)

    header = {
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "versions": ", ".join(f"{name} {version}" for name, version in versions().items()),
        "command": "`make bench` (`python benchmarks/suite.py" + (" --quick" if args.quick else "") + "`)"
        + ("" if torch_available else "; torch not installed, so no PyTorch rows"),
        "duration": f"{minutes:.1f} minutes ("
        + ", ".join(f"{phase} {seconds / 60:.1f}" for phase, seconds in phases.items())
        + ")",
    }
    if args.quick:
        header["note"] = "**--quick run: one 2-second window per row; not figures to quote.**"
    Path(args.results).write_text(json.dumps({"header": header, "rows": results}, indent=1), encoding="utf-8")
    write_report(args.out, render(results, header))
    print(f"wrote {args.out} ({minutes:.1f} minutes)")
    return 1 if any("failed" in row for row in results) else 0


if __name__ == "__main__":
    sys.exit(main())
