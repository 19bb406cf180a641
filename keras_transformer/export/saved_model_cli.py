"""TensorFlow's `saved_model_cli`, with tensorflow-text's ops registered.

`saved_model_cli show` reads any export, but `saved_model_cli run` loads the
graph, and TensorFlow only knows the WordPiece ops once `tensorflow_text` has
been imported. Same arguments as `saved_model_cli`:

    python -m keras_transformer.export.saved_model_cli run --dir exports/translator/1 \\
        --tag_set serve --signature_def serving_default --input_exprs 'text=["Ein Hund läuft."]'
"""

import tensorflow_text  # noqa: F401  (registers the ops)
from tensorflow.python.tools import saved_model_cli

if __name__ == "__main__":
    saved_model_cli.main()
