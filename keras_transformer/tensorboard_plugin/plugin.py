"""The "Attention" tab: a TensorBoard plugin serving the attention explorer and the weights it draws.

TensorBoard finds the plugin through the package's `tensorboard_plugins`
entry point, shows the tab when a run holds summaries of this plugin
(`summaries.write_sample`, written by `AttentionMapLogger`), and loads the
page's JavaScript module (`static/explorer.js`) in the tab's frame. The page
asks the plugin for data through these routes (under
`/data/plugin/attention/`):

    index                          runs, their samples, each sample's steps, kinds and layers
    sample?run=&sample=&step=      one sample at one step: its texts and every map with its tokens
    index.js, explorer.css         the page itself (shipped in the package: nothing is fetched elsewhere)
    explorer.html                  the same page on its own, its selection in its URL (shareable links)

TensorBoard keeps at most 10 steps of a plugin's summaries per tag unless
told otherwise: `tensorboard --logdir ... --samples_per_plugin attention=all`
keeps every epoch.
"""

import json

from tensorboard import plugin_util
from tensorboard.backend import http_util
from tensorboard.data import provider
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from keras_transformer.tensorboard_plugin import page_data, summaries

_STATIC_FILES = {
    "/index.js": (page_data.SCRIPT, "text/javascript"),
    "/explorer.css": (page_data.STYLE, "text/css"),
}
_STANDALONE_PAGE = (
    '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>Attention</title><link rel="icon" href="data:,"></head>'
    '<body data-attention-explorer="fetch"><script type="module" src="index.js"></script></body></html>\n'
)
# Enough for any number of epochs a run logs: every stored step is read.
_ALL_STEPS = 1 << 30


class AttentionPlugin(base_plugin.TBPlugin):
    """Serves the attention explorer and the `summaries` it reads (see the module docstring)."""

    plugin_name = summaries.PLUGIN_NAME

    def __init__(self, context):
        self._data_provider = context.data_provider

    def get_plugin_apps(self):
        apps = {route: self._static(name, mimetype) for route, (name, mimetype) in _STATIC_FILES.items()}
        apps["/explorer.html"] = self._standalone_page
        apps["/index"] = self._serve_index
        apps["/sample"] = self._serve_sample
        return apps

    def is_active(self):
        return False  # TensorBoard asks the data instead: `data_plugin_names`

    def data_plugin_names(self):
        return (summaries.PLUGIN_NAME,)

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="Attention")

    # -- the page ------------------------------------------------------------------------

    def _static(self, name, mimetype):
        body = (page_data.STATIC / name).read_bytes()

        @wrappers.Request.application
        def serve(request):
            return http_util.Respond(request, body, mimetype)

        return serve

    @wrappers.Request.application
    def _standalone_page(self, request):
        return http_util.Respond(request, _STANDALONE_PAGE, "text/html")

    # -- the data ------------------------------------------------------------------------

    @wrappers.Request.application
    def _serve_index(self, request):
        return http_util.Respond(request, self.index(*self._where(request)), "application/json")

    @wrappers.Request.application
    def _serve_sample(self, request):
        try:
            run = request.args["run"]
            sample, step = int(request.args["sample"]), int(request.args["step"])
        except (KeyError, ValueError):
            return http_util.Respond(
                request, {"error": "sample needs run, sample (a number) and step (a number)"}, "application/json", code=400
            )
        found = self.sample(*self._where(request), run, sample, step)
        if found is None:
            return http_util.Respond(
                request, {"error": f"no sample {sample} at step {step} in run {run!r}"}, "application/json", code=404
            )
        return http_util.Respond(request, json.dumps(found, ensure_ascii=False), "application/json")

    def _where(self, request):
        return plugin_util.context(request.environ), plugin_util.experiment_id(request.environ)

    def _series(self, context, experiment, runs=None, wanted=lambda content: True):
        """`{run: {tag: (plugin content, [TensorDatum, ...])}}` of this plugin's summaries whose content is `wanted`.

        Only the wanted tags are read: a run's weights of every sample and
        epoch can be large, and one request needs one sample's.
        """
        listed = self._data_provider.list_tensors(
            context, experiment_id=experiment, plugin_name=self.plugin_name,
            run_tag_filter=provider.RunTagFilter(runs=runs),
        )
        contents = {
            run: {tag: summaries.map_content(series.plugin_content) for tag, series in tags.items()}
            for run, tags in listed.items()
        }
        chosen = {run: [tag for tag, content in tags.items() if wanted(content)] for run, tags in contents.items()}
        tags = sorted({tag for run_tags in chosen.values() for tag in run_tags})
        data = self._data_provider.read_tensors(
            context, experiment_id=experiment, plugin_name=self.plugin_name, downsample=_ALL_STEPS,
            run_tag_filter=provider.RunTagFilter(runs=list(chosen), tags=tags),
        ) if tags else {}
        return {
            run: {tag: (contents[run][tag], data.get(run, {}).get(tag, [])) for tag in run_tags}
            for run, run_tags in chosen.items()
        }

    def index(self, context, experiment):
        """Runs, samples, steps, kinds and layers (`page_data`'s index)."""
        runs = []
        # The texts give the steps and labels; the maps' kinds and layers are in their metadata alone.
        texts_only = self._series(context, experiment, wanted=lambda content: content.get("type") == summaries.TEXTS)
        listed = self._data_provider.list_tensors(context, experiment_id=experiment, plugin_name=self.plugin_name)
        for run in sorted(listed):
            samples = {}
            for tag, series in listed[run].items():
                content = summaries.map_content(series.plugin_content)
                if "sample" not in content:
                    continue
                entry = samples.setdefault(content["sample"], {"label": "", "steps": [], "kinds": {}})
                if content.get("type") == summaries.TEXTS:
                    data = texts_only.get(run, {}).get(tag, (None, []))[1]
                    if data:
                        entry["steps"] = [datum.step for datum in data]
                        entry["label"] = page_data.sample_label(summaries.read_texts(data[-1].numpy)[0])
                elif content.get("type") == summaries.ATTENTION:
                    entry["kinds"].setdefault(content["kind"], []).append(content["layer"])
            if samples:
                entries = [page_data.index_sample(sample, **entry) for sample, entry in sorted(samples.items())]
                runs.append({"run": run, "samples": entries})
        return {"runs": runs}

    def sample(self, context, experiment, run, sample, step):
        """One sample at one step, its texts and every map with its tokens (`page_data`'s sample); None if absent."""
        tags = self._series(context, experiment, runs=[run], wanted=lambda content: content.get("sample") == sample)
        at_step = {}
        for content, data in tags.get(run, {}).values():
            if content.get("sample") == sample:
                value = next((datum.numpy for datum in data if datum.step == step), None)
                if value is not None:
                    at_step.setdefault(content.get("type"), []).append((content, value))
        if summaries.TEXTS not in at_step:
            return None
        texts, tokens = summaries.read_texts(at_step[summaries.TEXTS][0][1])
        maps = [
            (content["kind"], content["layer"], content["queries"], content["keys"], weights)
            for content, weights in at_step.get(summaries.ATTENTION, [])
        ]
        return page_data.sample_page(run, sample, step, texts, tokens, maps)
