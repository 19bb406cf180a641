"""The attention explorer as one HTML file that opens offline.

The explorer is the interactive page of the TensorBoard plugin: point at a
word to see which words it attends to, switch heads on and off, compare the
heatmaps of the heads side by side, and slide through the training epochs.
Inside TensorBoard the page asks the plugin for its data. This module builds
the same page as a single file instead, with the data written into it, so it
can be saved next to a run, attached to a report, or opened with a double
click, without TensorBoard and without a network.

The file holds three things the browser needs:

- the page's style (``explorer.css``) in a ``<style>`` element;
- the data, as JSON, in ``<script type="application/json" id="attention-data">``:
  ``{"index": INDEX, "samples": {"RUN\\u0000SAMPLE\\u0000STEP": SAMPLE, ...}}``,
  where INDEX lists the runs, samples, epochs and attention kinds, and each
  SAMPLE holds one epoch's attention maps of one sample (the shapes are
  described at the top of ``explorer.js``);
- the page's code (``explorer.js``) in a ``<script type="module">``. The
  ``data-attention-explorer="embedded"`` mark on ``<body>`` tells it to read
  the JSON above rather than ask a server.

    html = explorer_html({"index": index, "samples": samples}, title="Attention")
    Path("attention.html").write_text(html, encoding="utf-8")
"""

import html
import json

from keras_transformer import saving

# explorer.js and explorer.css live with the TensorBoard plugin, which serves
# them as they are; this page copies them in.
from keras_transformer.tensorboard_plugin.page_data import SCRIPT, STATIC, STYLE, embedded, sample_page


def _json_for_script(data):
    """JSON that cannot end the <script> element it sits in.

    A token such as "</script>" would otherwise close the element early and
    let the rest of the text run as HTML. JSON allows `\\u003c` for `<` (and
    the like), which JSON.parse turns back into the same characters.
    """
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, default=_to_json)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _to_json(value):
    """NumPy arrays and numbers (attention weights usually are) as lists and floats."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def explorer_html(data, title="Attention"):
    """One self-contained HTML page of the attention explorer.

    Args:
        data: `{"index": INDEX, "samples": {key: SAMPLE}}` with
            key = f"{run}\\0{sample}\\0{step}" (NUL-separated), in the shapes
            the TensorBoard plugin answers `index` and `sample` with. NumPy
            arrays are accepted for the weights.
        title: the page's title and heading.

    Returns:
        The page as a string; write it to a `.html` file (UTF-8).
    """
    style = (STATIC / STYLE).read_text(encoding="utf-8")
    # "<\/script" means the same as "</script" everywhere in JavaScript, but
    # does not end the inline <script> element.
    script = (STATIC / SCRIPT).read_text(encoding="utf-8").replace("</script", "<\\/script")
    escaped_title = html.escape(title)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escaped_title}</title>
<link rel="icon" href="data:,">
<style id="attention-explorer-style">
{style}
</style>
</head>
<body data-attention-explorer="embedded">
<h1 class="explorer-title">{escaped_title}</h1>
<script type="application/json" id="attention-data">{_json_for_script(data)}</script>
<script type="module">
{script}
</script>
</body>
</html>
"""


def write_explorer(path, texts, tokens, maps, title, run="sentence"):
    """One text's attention maps as an explorer page at `path`, replaced whole (a kill leaves the old file or the new).

    Args:
        texts: `{name: text}` shown beside the maps ("source", "translation"; "prompt", "text").
        tokens, maps: by side, as for `tensorboard_plugin.summaries.write_sample`.
        title: the page's title.
        run: the name the page's run menu shows.
    """
    document = explorer_html(embedded([sample_page(run, 0, 0, texts, tokens, maps)]), title=title)

    def write(staging):
        with open(staging, "w", encoding="utf-8") as file:
            file.write(document)

    saving.replace_whole(path, write)
