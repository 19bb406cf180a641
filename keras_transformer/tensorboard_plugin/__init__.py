"""The attention explorer: TensorBoard's "Attention" tab, and the same page as one HTML file.

`summaries` is how attention weights are written to TensorBoard logs;
`plugin.AttentionPlugin` serves them and the page (`static/explorer.js`,
`static/explorer.css`) to TensorBoard, which finds it through the package's
`tensorboard_plugins` entry point. `keras_transformer.visualization.explorer_html`
puts the same page and one sentence's weights into a self-contained file.
"""

from keras_transformer.tensorboard_plugin.summaries import PLUGIN_NAME, write_sample

__all__ = ["PLUGIN_NAME", "write_sample"]
