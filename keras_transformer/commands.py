"""What each command of `keras-transformer` does, once `cli.py` has parsed it: call `runs/`, print.

One function per command (`train`, `translate`, `export`, ...), each given
the parsed arguments. TensorFlow starts inside them, on first use: `--help`
never reaches this far. Texts come in as `lines.py` reads them, one answer
per text.
"""

import json
import sys

from keras_transformer.lines import read_lines, valid_text
from keras_transformer.runs import options

def _config_from_arguments(arguments, task):
    return options.config_from_options(task, vars(arguments))


def _split_cpu_first(arguments):
    # Splitting the CPU must come before TensorFlow makes its first tensor.
    replicas = getattr(arguments, "training.cpu_replicas", None)
    if replicas:
        from keras_transformer.training import split_cpu

        split_cpu(replicas)


def _finished(metrics, out):
    if not metrics.get("nothing_to_train"):
        return False
    print(
        f"\n{out} has finished its {metrics['epochs_done']} epoch(s): nothing to train. Give --epochs above "
        f"{metrics['epochs_done']} to train it further, or --overwrite to start over."
    )
    return True


def _trained(arguments, task):
    """Train (or continue) the run `arguments` describe: its metrics, or None when there is nothing to report."""
    _split_cpu_first(arguments)
    from keras_transformer.runs import task_module

    metrics = task_module(task).train(_config_from_arguments(arguments, task), arguments.out,
                                      overwrite=arguments.overwrite)
    # A translation run's are its training's alone; the others' have a section per split.
    training = metrics if task == options.TRANSLATION else metrics["training"]
    if _finished(training, arguments.out) or not _reports():
        return None
    return metrics


def train(arguments):
    training = _trained(arguments, options.TRANSLATION)
    if training is None:
        return
    from keras_transformer.runs import translation

    print(
        f"\ntrained {training['epochs_this_session']} epoch(s) in {training['seconds_this_session']:.0f}s "
        f"({training['seconds_per_epoch']:.0f}s/epoch, {training['parameters']:,} parameters)"
    )
    if not arguments.no_evaluate:
        _report_translation(*translation.evaluate(arguments.out, "val"))
    print(f"\nrun directory: {arguments.out}")
    print(f"TensorBoard:   tensorboard --logdir {arguments.out}/logs")


def import_hf(arguments):
    from keras_transformer.runs import translation

    config = translation.import_checkpoint(
        arguments.checkpoint_dir, arguments.run_dir, arguments.source_lang, arguments.target_lang
    )
    model, decoding = config["model"], config["evaluation"]
    print(f"imported {arguments.checkpoint_dir} into {arguments.run_dir}: {model['num_layers']} + "
          f"{model['num_layers']} layers, d_model {model['d_model']}, beam {decoding['beam_size']}, "
          f"at most {decoding['max_output_length']} tokens out")
    print(f"try it:        keras-transformer translate {arguments.run_dir} \"...\"")
    print(f"fine-tune it:  keras-transformer train --init-from {arguments.run_dir} --dataset files ... --out ...")


def train_and_report(arguments, task):
    """`train-classifier`, `pretrain`, `train-lm`: train, then print the result, the run directory, what next."""
    metrics = _trained(arguments, task)
    if metrics is None:
        return
    val, training, out = metrics.get("val", {}), metrics["training"], arguments.out
    per_epoch = f"{training['seconds_per_epoch']:.0f}s/epoch"
    if task == options.CLASSIFICATION:
        lines = (f"validation accuracy {val['accuracy']:.4f} on {val['examples']} examples; {per_epoch}",
                 f"run directory: {out}",
                 f"try it:        keras-transformer classify {out} \"...\"",
                 f"TensorBoard:   tensorboard --logdir {out}/logs   (Projector: the [CLS] embeddings)")
    elif task == options.PRETRAINING:
        lines = (f"validation: {val['masked_accuracy']:.4f} of the hidden tokens guessed, on {val['texts']} texts; "
                 f"{per_epoch}",
                 f"run directory: {out}",
                 f"next:          keras-transformer train-classifier --init-from {out} --dataset ... --out ...")
    else:
        lines = (f"validation perplexity {training['final']['val_perplexity']:.2f} (per token); {per_epoch}",
                 f"run directory: {out}",
                 f"try it:        keras-transformer generate {out} \"...\" --seed 1")
    print("\n" + "\n".join(lines))


def generate(arguments):
    settings = dict(seed=arguments.seed, temperature=arguments.temperature, top_k=arguments.top_k,
                    top_p=arguments.top_p, max_new_tokens=arguments.max_new_tokens)
    if not (arguments.litert or arguments.run_dir):
        raise ValueError("generate needs a run directory or --litert DIR")
    # With --litert there is no run directory: the first positional is a text.
    positionals = ([arguments.run_dir] if arguments.litert and arguments.run_dir is not None else [])
    positionals += arguments.prompts
    if not arguments.litert:
        _task_of(arguments.run_dir, "generate", (options.LANGUAGE_MODEL,))
    prompts, names = _texts_given(positionals)
    if not prompts:
        raise ValueError("give prompts as arguments or on stdin, one a line")
    if arguments.litert:
        from keras_transformer.on_device import LiteRTModel

        texts = LiteRTModel(arguments.litert).generate(prompts, **settings)
    else:
        from keras_transformer.runs import language_model

        texts = language_model.generate(arguments.run_dir, prompts, **settings)
    _print_answers(texts, names)


def _reports():
    """Whether this process reports a training run: yes, but on a cluster's workers other than the chief."""
    from keras_transformer.training import is_chief

    if is_chief():
        return True
    print("\ntraining done; the chief worker wrote the run directory and reports it")
    return False


def _report_translation(scores, samples):
    print(
        f"\nvalidation BLEU {scores['bleu']:.1f} (lowercased {scores['bleu_lowercase']:.1f}), "
        f"chrF {scores['chrf']:.1f} on {scores['sentences']} sentences, beam size {scores['beam_size']}"
    )
    for sample in samples:
        print(f"\n  source:      {sample['source']}\n  reference:   {sample['reference']}\n  translation: {sample['translation']}")


def _report_classification(scores):
    names = list(scores["classes"])
    width = max(len(name) for name in names + ["class"])
    print(f"accuracy {scores['accuracy']:.4f} on {scores['examples']} examples ({scores['data']})\n")
    print(f"{'class':<{width}}  precision  recall  f1      support")
    for name, row in scores["classes"].items():
        print(f"{name:<{width}}  {row['precision']:<9.4f}  {row['recall']:<6.4f}  {row['f1']:<6.4f}  {row['support']}")
    print(f"\nconfusion matrix (rows: true class, columns: predicted), in the order {', '.join(names)}:")
    for name, row in zip(names, scores["confusion"]):
        print(f"{name:<{width}}  " + "  ".join(f"{count:>6}" for count in row))


def _task_of(run_dir, command, allowed=options.TASKS):
    from keras_transformer.runs import run_dir as runs

    task = runs.task_of(run_dir)
    if task not in allowed:
        raise ValueError(f"{command} works on {' or '.join(allowed)} runs; {run_dir} is a {task} run")
    return task


def evaluate(arguments):
    from keras_transformer.runs import task_module

    task = _task_of(arguments.run_dir, "evaluate")
    if task == options.TRANSLATION:
        if arguments.csv:
            raise ValueError(f"--csv is for classifier runs; {arguments.run_dir} is a translation run")
        scores, samples = task_module(task).evaluate(
            arguments.run_dir, arguments.split, arguments.beam_size, arguments.batch_size, arguments.length_penalty,
            tsv=arguments.tsv,
        )
        _report_translation(scores, samples)
        print(f"\nhypotheses: {scores['hypotheses']}")
        print(json.dumps({key: scores[key] for key in ("bleu", "bleu_lowercase", "chrf")}))
    elif arguments.beam_size or arguments.length_penalty is not None or arguments.split != "val" or arguments.tsv:
        raise ValueError(
            f"--beam-size, --length-penalty, --split and --tsv are for translation runs; {arguments.run_dir} is a "
            f"{task} run"
        )
    elif task == options.LANGUAGE_MODEL:
        if arguments.csv:
            raise ValueError(f"--csv is for classifier runs; {arguments.run_dir} is a language model (use --text)")
        scores = task_module(task).evaluate(arguments.run_dir, arguments.text, arguments.batch_size or 32)
        print(
            f"perplexity {scores['perplexity']:.2f} per token, {scores['bits_per_character']:.3f} bits per character "
            f"on {scores['texts']} texts ({scores['data']})"
        )
        print(json.dumps({key: scores[key] for key in ("perplexity", "bits_per_character")}))
    else:
        if arguments.text:
            raise ValueError(f"--text is for language-model runs; {arguments.run_dir} is a {task} run")
        _report_classification(task_module(task).evaluate(arguments.run_dir, arguments.csv, arguments.batch_size))


def _texts_given(positionals):
    """`(texts, names)`: the texts a command answers, one each, and how a message names each.

    The arguments, or else every line of stdin, blank ones included (`lines`):
    one answer per line, line N answering line N. Bytes that are not UTF-8
    become U+FFFD, with one line on stderr naming where they were.
    """
    if positionals:
        given = [valid_text(text) for text in positionals]
        names = [f"argument {number}" for number in range(1, len(given) + 1)]
    else:
        given = read_lines(sys.stdin)
        names = [f"line {number}" for number in range(1, len(given) + 1)]
    for name, (_, repaired) in zip(names, given):
        if repaired:
            _warn(f"{name}: bytes that are not UTF-8 were read as U+FFFD")
    return [text for text, _ in given], names


def _print_answers(answers, names, unit="translated"):
    """Each answer on its own line; then, on stderr, each text the model read only part of."""
    for answer in answers:
        print(answer)
    for index, pieces in sorted(getattr(answers, "truncated", {}).items()):
        read = f"its first {pieces} pieces were" if pieces else "its beginning was"
        _warn(f"{names[index]} is longer than the model reads: only {read} {unit}")


def _warn(message):
    print(f"keras-transformer: {message}", file=sys.stderr)


def translate(arguments):
    if sum(bool(road) for road in (arguments.saved_model, arguments.ctranslate2, arguments.litert)) > 1:
        raise ValueError("give one of --saved-model, --ctranslate2 and --litert")
    if (arguments.litert or arguments.saved_model) and arguments.beam_size:
        raise ValueError("--beam-size cannot change an export: its beam size was fixed by `export`")
    exported = arguments.litert or arguments.ctranslate2 or arguments.saved_model
    if not (exported or arguments.run_dir):
        raise ValueError("translate needs a run directory or --saved-model EXPORT")
    # With an export there is no run directory: the first positional is a sentence.
    positionals = ([arguments.run_dir] if exported and arguments.run_dir is not None else []) + arguments.sentences
    if not exported:
        _task_of(arguments.run_dir, "translate", (options.TRANSLATION,))
    sentences, names = _texts_given(positionals)
    if arguments.litert:
        # No TensorFlow in this process: the LiteRT runtime alone (keras_transformer.on_device).
        from keras_transformer.on_device import LiteRTModel

        translations = LiteRTModel(arguments.litert).translate(sentences)
    else:
        from keras_transformer.runs import translation

        if arguments.ctranslate2:
            translations = translation.translate_with_ctranslate2(arguments.ctranslate2, sentences,
                                                                  arguments.beam_size)
        elif arguments.saved_model:
            translations = translation.translate_with_export(arguments.saved_model, sentences)
        else:
            translations = translation.translate(arguments.run_dir, sentences, arguments.beam_size)
    _print_answers(translations, names)


def average_checkpoints(arguments):
    from keras_transformer.runs.averaging import average_checkpoints

    epochs = average_checkpoints(arguments.run_dir, arguments.out, arguments.last)
    print(f"{arguments.out}: the mean of epochs {', '.join(map(str, epochs))} of {arguments.run_dir}")
    print(f"evaluate it: keras-transformer evaluate {arguments.out}")


def classify(arguments):
    if not (arguments.litert or arguments.run_dir):
        raise ValueError("classify needs a run directory or --litert DIR")
    # With --litert there is no run directory: the first positional is a text.
    positionals = ([arguments.run_dir] if arguments.litert and arguments.run_dir is not None else [])
    positionals += arguments.texts
    if arguments.litert:
        from keras_transformer.on_device import LiteRTModel

        texts, names = _texts_given(positionals)
        labels = LiteRTModel(arguments.litert).classify(texts)
    else:
        _task_of(arguments.run_dir, "classify", (options.CLASSIFICATION,))
        from keras_transformer.runs import classification

        texts, names = _texts_given(positionals)
        labels = classification.classify(arguments.run_dir, texts)
    # A blank text has nothing to classify: a blank line answers it.
    lines = ["" if label is None else f"{label}\t{probability:.4f}" for label, probability in labels]
    _print_answers(lines, names)


def export(arguments):
    from keras_transformer.runs import exporters

    settings = dict(version=arguments.version, quantization=arguments.quantization, ops=arguments.ops,
                    beam_size=arguments.beam_size,
                    length_alpha=arguments.length_penalty, max_output_length=arguments.max_output_length)
    for line in exporters.export(arguments.run_dir, arguments.export_base, arguments.format, **settings):
        print(line)


def plot_attention(arguments):
    if not (arguments.out or arguments.html):
        raise ValueError("plot-attention needs --out FILE.png, --html FILE.html, or both")
    from keras_transformer.runs import translation

    if arguments.saved_model:
        # No run directory with an export: the positional is the sentence.
        sentence = arguments.sentence or arguments.run_dir
        if arguments.out or arguments.sentence or not sentence:
            raise ValueError(
                "with --saved-model, give one sentence and --html: an export gives its cross-attention "
                "(for PNGs and the other kinds, use its run directory)"
            )
        translated = translation.plot_attention_with_export(arguments.saved_model, sentence, arguments.html)
    else:
        if not (arguments.run_dir and arguments.sentence):
            raise ValueError("plot-attention needs a run directory and a sentence (or --saved-model EXPORT)")
        task = _task_of(arguments.run_dir, "plot-attention", (options.TRANSLATION, options.LANGUAGE_MODEL))
        if task == options.LANGUAGE_MODEL:
            if arguments.kind not in (None, "decoder_self") or arguments.beam_size:
                raise ValueError("a language model has --kind decoder_self only, and samples instead of --beam-size")
            from keras_transformer.runs import language_model

            translated = language_model.plot_attention(
                arguments.run_dir, arguments.sentence, png=arguments.out, html=arguments.html, layer=arguments.layer,
                heads=arguments.heads, seed=arguments.seed or 0,
            )
        else:
            if arguments.seed is not None:
                raise ValueError("--seed is for language-model runs: a translation is searched, not sampled")
            translated = translation.plot_attention(
                arguments.run_dir, arguments.sentence, png=arguments.out, html=arguments.html,
                kind=arguments.kind or "cross", layer=arguments.layer, beam_size=arguments.beam_size,
                heads=arguments.heads,
            )
    print(translated)
    for path in (arguments.out, arguments.html):
        if path:
            print(f"attention: {path}")
