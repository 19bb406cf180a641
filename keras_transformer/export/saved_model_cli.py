"""TensorFlow's `saved_model_cli`, with tensorflow-text's ops registered.

`saved_model_cli show` reads any export, but `saved_model_cli run` loads the
graph, and TensorFlow only knows the WordPiece ops once `tensorflow_text` has
been imported. Same arguments as `saved_model_cli`:

    python -m keras_transformer.export.saved_model_cli run --dir exports/translator/1 \\
        --tag_set serve --signature_def serving_default --input_exprs 'text=["Ein Hund läuft."]'
"""

import sys
from importlib.metadata import entry_points

import tensorflow_text  # noqa: F401  (registers the ops)

if __name__ == "__main__":
    # The command TensorFlow installs as `saved_model_cli`, found as pip found it: its entry point.
    commands = list(entry_points(group="console_scripts", name="saved_model_cli"))
    if len(commands) != 1:
        sys.exit(f"saved_model_cli: TensorFlow's command is not installed here ({len(commands)} found)")
    sys.exit(commands[0].load()())
