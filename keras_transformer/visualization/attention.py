"""Attention heatmaps with the tokens on the axes.

Section 3.2 describes attention as each query position distributing one unit
of weight over the key positions. A heatmap shows exactly that: one row per
query token (who is looking), one column per key token (looked at), one panel
per head. Cross-attention maps of a translation show the soft alignment
between target and source words that the paper's Figures 3-5 illustrate.

Works on anything shaped like attention: the arrays of
`Transformer(..., return_attention_scores=True)`, `Translator.attention_maps`,
or the `cross_attention` output of an exported SavedModel. The maps' names,
and which tokens label their rows and columns, are in
`keras_transformer.models.attention_maps`:

    queries, keys = queries_and_keys(kind, result["source_tokens"], result["target_tokens"])
    plot_attention(result["attention"][attention_map_name(kind, layer)], queries, keys)
"""

import io

import numpy as np


def _tokens(tokens):
    """Strings (bytes decoded), without the "" padding an export adds."""
    decoded = [token.decode("utf-8", "replace") if isinstance(token, bytes) else str(token) for token in tokens]
    return [token for token in decoded if token]


def plot_attention(attention, query_tokens, key_tokens, heads=None, title=None, columns=4, panel_size=2.6):
    """One panel per head: rows are query tokens, columns key tokens.

    Args:
        attention: `(heads, queries, keys)` weights (or `(queries, keys)` for
            one head). Rows and columns beyond the tokens given are dropped,
            so padded outputs can be passed as they are.
        query_tokens: labels of the rows (e.g. target tokens); "" entries
            (padding) are dropped.
        key_tokens: labels of the columns (e.g. source tokens).
        heads: which heads to draw (default all).
        title: the figure's title.
        columns: panels per row of the grid.
        panel_size: inches per panel.

    Returns:
        A matplotlib `Figure` with a shared colour scale from 0 to the largest
        weight shown.

    Example:
    >>> outputs = translator.translate_with_attention(tf.constant(["Ein Hund läuft."]))
    >>> figure = plot_attention(outputs["cross_attention"][0, -1],          # last layer
    ...                         outputs["target_tokens"][0].numpy(), outputs["source_tokens"][0].numpy())
    >>> figure.savefig("alignment.png")
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    weights = np.asarray(attention, dtype=np.float32)
    if weights.ndim == 2:
        weights = weights[None]
    if weights.ndim != 3:
        raise ValueError(f"attention must be (heads, queries, keys) or (queries, keys), got shape {weights.shape}")
    queries, keys = _tokens(query_tokens), _tokens(key_tokens)
    if len(queries) > weights.shape[1] or len(keys) > weights.shape[2]:
        raise ValueError(
            f"{len(queries)} query and {len(keys)} key tokens do not fit attention of shape {weights.shape}"
        )
    heads = list(range(weights.shape[0])) if heads is None else list(heads)
    weights = weights[heads][:, : len(queries), : len(keys)]

    columns = max(1, min(columns, len(heads)))
    rows = -(-len(heads) // columns)
    # Long sentences need room for their labels.
    scale = max(1.0, max(len(queries), len(keys)) / 12)
    figure = Figure(
        figsize=(panel_size * scale * columns + 1.5, panel_size * scale * rows + 1.2), dpi=100, layout="constrained"
    )
    axes = figure.subplots(rows, columns, squeeze=False)
    vmax = float(weights.max()) if weights.size else 1.0
    image = None
    for panel, axis in enumerate(axes.flat):
        if panel >= len(heads):
            axis.set_visible(False)
            continue
        image = axis.imshow(weights[panel], cmap="viridis", vmin=0.0, vmax=vmax or 1.0, aspect="auto")
        axis.set_title(f"head {heads[panel]}", fontsize=9)
        axis.set_xticks(range(len(keys)), keys, rotation=90, fontsize=7)
        # Every panel of a row shares the query labels: print them once, on the left.
        axis.set_yticks(range(len(queries)), queries if panel % columns == 0 else [], fontsize=7)
    if title:
        figure.suptitle(title, fontsize=10)
    figure.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    return figure


def figure_to_png(figure):
    """PNG bytes of a figure (for files, TensorBoard or a notebook)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
