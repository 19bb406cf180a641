"""Pictures of what a model does: attention heatmaps (matplotlib) and the interactive explorer (HTML)."""

from keras_transformer.visualization.attention import figure_to_png, plot_attention
from keras_transformer.visualization.explorer import explorer_html, write_explorer

__all__ = ["explorer_html", "figure_to_png", "plot_attention", "write_explorer"]
