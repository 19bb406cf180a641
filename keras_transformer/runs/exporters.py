"""One exporter per format, behind one table: what `keras-transformer export RUN OUT --format F` writes.

Each row says which kinds of run the format takes, which task function
writes it, what it accepts (a version number, a storage precision, the
translator's decoding settings) and what to tell the user once it is
written. The command line asks the table (`FORMATS`, `export`) and checks
nothing of a format itself. Importing this module starts no TensorFlow:
`--help` lists the formats at once.
"""

import dataclasses

from keras_transformer.runs.options import CLASSIFICATION, LANGUAGE_MODEL, TRANSLATION

# The command that reads each kind of run's exports, as the report's "try it" line names it.
_COMMANDS = {TRANSLATION: "translate", CLASSIFICATION: "classify", LANGUAGE_MODEL: "generate"}
# What a translator's export takes beside the run: its search settings (flag, keyword of the task function).
DECODING_OPTIONS = (("--beam-size", "beam_size"), ("--length-penalty", "length_alpha"),
                    ("--max-output-length", "max_output_length"))


@dataclasses.dataclass(frozen=True)
class Exporter:
    """One format: which runs it takes, the task function that writes it, what it accepts, how it reports.

    `quantizations`: what `--quantization` may name (None: the task
    function checks it); `versioned`: writes `OUT/N/` (TensorFlow Serving's
    layout, `--version N`), else a new directory; `decoding_options`: a
    translator's export keeps its own `DECODING_OPTIONS`; `runner_flag`:
    how the command of the run's kind reads the export, for the kinds in
    `runner_tasks` (`translate --saved-model`; `classify --litert`);
    `takes_ops`: what `--ops` names, the operators around the model
    (LiteRT's text kernels or builtin operators only); `try_it`: the
    "try it" line of a format no command reads (`{path}`: the export).
    """

    title: str
    tasks: tuple
    function: str
    quantizations: tuple | None = ()
    versioned: bool = False
    decoding_options: bool = True
    runner_flag: str | None = None
    runner_tasks: tuple = (TRANSLATION, CLASSIFICATION, LANGUAGE_MODEL)
    takes_ops: bool = False
    try_it: str | None = None

    def refusal(self, name, task, options):
        """Why this export cannot be made from these options (one line), or None."""
        given = [flag for flag, keyword in DECODING_OPTIONS if options.get(keyword) is not None]
        if task not in self.tasks:
            if self.tasks == (TRANSLATION,):
                return f"--format {name} exports a translation run, to a new directory (no --version)"
            return f"--format {name} exports {' or '.join(self.tasks)} runs; this is a {task} run"
        if options.get("version") and not self.versioned:
            return f"--format {name} writes a new directory (no --version)"
        if given and task != TRANSLATION:
            return "--beam-size, --length-penalty and --max-output-length are for translation runs"
        if options.get("ops") is not None and not self.takes_ops:
            return "--ops is for --format litert"
        if given and not self.decoding_options:
            return (f"--format {name} writes the run's own decoding settings (no --beam-size, --length-penalty "
                    "or --max-output-length)")
        quantization = options.get("quantization")
        if quantization is not None and self.quantizations is not None and quantization not in self.quantizations:
            if not self.quantizations:
                return "--quantization is for --format ctranslate2, litert, web or hf"
            return f"--format {name} stores float32, {' or '.join(self.quantizations)} weights, not {quantization}"
        return None

    def keywords(self, task, options):
        """The task function's keyword arguments besides the run and the output."""
        keywords = {}
        if self.versioned:
            keywords["version"] = options.get("version")
        if self.quantizations != ():
            keywords["dtype" if self.function == "export_hf" else "quantization"] = options.get("quantization")
        if self.takes_ops:
            keywords["ops"] = options.get("ops") or "text"
        if task == TRANSLATION and self.decoding_options:
            keywords.update((keyword, options.get(keyword)) for _, keyword in DECODING_OPTIONS)
        return keywords


# The formats `export --format` offers, the default first.
FORMATS = {
    "saved_model": Exporter("SavedModel", (TRANSLATION, CLASSIFICATION, LANGUAGE_MODEL), "export", versioned=True,
                            runner_flag="--saved-model", runner_tasks=(TRANSLATION,)),
    "ctranslate2": Exporter("CTranslate2 model", (TRANSLATION,), "export_ctranslate2", quantizations=None,
                            runner_flag="--ctranslate2"),
    "litert": Exporter("LiteRT model", (TRANSLATION, CLASSIFICATION, LANGUAGE_MODEL), "export_litert",
                       quantizations=None, runner_flag="--litert", takes_ops=True),
    "hf": Exporter("Hugging Face checkpoint", (TRANSLATION,), "export_hf", quantizations=("float16", "bfloat16"),
                   decoding_options=False, try_it="keras-transformer import-hf {path} RUN_DIR, or "
                   "from_pretrained({path!r}) in transformers"),
    "web": Exporter("web page", (TRANSLATION, CLASSIFICATION, LANGUAGE_MODEL), "export_web", quantizations=None,
                    try_it="python -m http.server --directory {path} 8000, then open http://127.0.0.1:8000/"),
}
FORMAT_HELP = ("a SavedModel (default), a CTranslate2 model with our tokenizers (translation), one LiteRT file for "
               "on-device use, a Hugging Face checkpoint (translation: an imported run as its family, a "
               "SentencePiece run as Marian), or a static web page that answers offline (LiteRT.js)")


def export(run_dir, out, name="saved_model", **options):
    """Write `run_dir` as format `name` into `out`; returns the lines that tell the user what was written.

    `options`: `version`, `quantization`, `ops`, `beam_size`, `length_alpha`,
    `max_output_length` (None: the default). A format the run cannot take,
    or an option the format does not, is a one-line ValueError before
    anything is loaded.
    """
    from keras_transformer.runs import run_dir as runs
    from keras_transformer.runs import task_module

    exporter, task = FORMATS[name], runs.task_of(run_dir)
    if task not in _COMMANDS:
        raise ValueError(f"export works on {' or '.join(_COMMANDS)} runs; {run_dir} is a {task} run")
    problem = exporter.refusal(name, task, options)
    if problem:
        raise ValueError(problem)
    module = task_module(task)
    path = getattr(module, exporter.function)(run_dir, out, **exporter.keywords(task, options))
    lines = [f"exported {exporter.title}: {path}"]
    lines += module.describe_saved_model(path) if name == "saved_model" else []
    if exporter.runner_flag and task in exporter.runner_tasks:
        lines.append(f"try it:     keras-transformer {_COMMANDS[task]} {exporter.runner_flag} {path} \"...\"")
    elif exporter.try_it:
        lines.append("try it:     " + exporter.try_it.format(path=path))
    return lines
