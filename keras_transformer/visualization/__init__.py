"""Pictures of what a model does: attention heatmaps (matplotlib)."""

from keras_transformer.visualization.attention import figure_to_png, plot_attention

__all__ = ["figure_to_png", "plot_attention"]
