"""The JSON the attention explorer page reads: an index of what there is, and one sample at one step.

The plugin answers the page's requests with these (`plugin.py`), and an
HTML file made for one sentence carries them inside
(`keras_transformer.visualization.explorer_html`, from `embedded`). The page
(`static/explorer.js`) documents the same shapes:

    index:  {"runs": [{"run": NAME, "samples": [{"sample": 0, "label": TEXT, "steps": [1, 2],
                                                  "kinds": {"cross": [0, 1], ...}}]}]}
    sample: {"run": NAME, "sample": 0, "step": 2, "texts": {"source": ..., ...},
             "maps": [{"kind": "cross", "layer": 0, "queries": [TOKEN, ...], "keys": [TOKEN, ...],
                       "sides": ["target", "source"], "weights": heads x queries x keys}]}
"""

from pathlib import Path

import numpy as np

# The page: served by the plugin as they are, copied into an HTML file by `explorer_html`.
STATIC = Path(__file__).resolve().parent / "static"
SCRIPT, STYLE = "explorer.js", "explorer.css"


def sample_page(run, sample, step, texts, tokens, maps):
    """One sample at one step; `maps` are `(kind, layer, queries side, keys side, weights)` as for `write_sample`."""
    entries = [
        {
            "kind": kind,
            "layer": int(layer),
            "queries": list(tokens.get(queries, [])),
            "keys": list(tokens.get(keys, [])),
            "sides": [queries, keys],
            # A diverged epoch's NaN would make the JSON unreadable: drawn as 0.
            "weights": np.round(np.nan_to_num(np.asarray(weights, np.float32)), 4).tolist(),
        }
        for kind, layer, queries, keys, weights in maps
    ]
    entries.sort(key=lambda entry: (entry["kind"], entry["layer"]))
    return {"run": run, "sample": int(sample), "step": int(step), "texts": dict(texts), "maps": entries}


def sample_label(texts):
    """What the sample menu shows: the sample's first text (the source sentence, the classified text)."""
    return next(iter(texts.values()), "") if texts else ""


def index_sample(sample, label, steps, kinds):
    """An index entry: `kinds` is `{kind: [layer, ...]}`."""
    return {
        "sample": int(sample),
        "label": label,
        "steps": sorted(int(step) for step in steps),
        "kinds": {kind: sorted(int(layer) for layer in layers) for kind, layers in sorted(kinds.items())},
    }


def embedded(pages):
    """The data an HTML file carries: the index of `pages` (sample pages) and the pages themselves."""
    runs = {}
    for page in pages:
        samples = runs.setdefault(page["run"], {})
        entry = samples.setdefault(page["sample"], {"label": "", "steps": [], "kinds": {}})
        entry["label"] = entry["label"] or sample_label(page["texts"])
        entry["steps"].append(page["step"])
        for item in page["maps"]:
            entry["kinds"].setdefault(item["kind"], set()).add(item["layer"])
    index = {
        "runs": [
            {"run": run, "samples": [index_sample(sample, **entry) for sample, entry in sorted(samples.items())]}
            for run, samples in runs.items()
        ]
    }
    # The page's key for a sample at a step: run, sample and step joined by NUL.
    keyed = {f"{page['run']}\u0000{page['sample']}\u0000{page['step']}": page for page in pages}
    return {"index": index, "samples": keyed}
