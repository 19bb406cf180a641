"""An export on disk: `EXPORT_BASE/<version>/`, the layout TensorFlow Serving watches.

The server serves the highest version and picks up a new one when it
appears. A version is written under a hidden temporary name and renamed
into place when complete, so the server never sees half an export, and an
existing version is never overwritten. `assets.extra/` beside the graph
holds the export's settings as JSON: it travels with the version but is not
part of the graph.
"""

import json
import logging
import os

import tensorflow as tf

from keras_transformer.saving import DamagedFileError, directory_written_whole, first_line


def _versions(export_base):
    if not os.path.isdir(export_base):
        return []
    return sorted(int(name) for name in os.listdir(export_base) if name.isdigit())


def version_path(export_base, version=None):
    """Where version `version` (default: the next one) of an export goes; an error if it exists."""
    if version is None:
        version = (_versions(export_base) or [0])[-1] + 1
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"version must be a positive integer, got {version!r}")
    path = os.path.join(export_base, str(version))
    if os.path.exists(path):
        raise FileExistsError(f"{path} already exists: pick another version or remove it first")
    return path


def save_quietly(root, directory, signatures):
    """`tf.saved_model.save`, without the line it logs for the user to read past.

    Saving says, through absl's logger at INFO, that tensorflow-text's
    inputs are renamed in the SavedModel (a hundred names on one line):
    nothing anyone acts on. An export prints what it wrote.
    """
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.WARNING)
    try:
        tf.saved_model.save(root, directory, signatures=signatures)
    finally:
        absl_logger.setLevel(level)


def write_version(export_base, version, service, settings_name, settings):
    """Save `service` (its `saveable()` and `signatures()`) as a new version; returns its path.

    Args:
        export_base: the directory TensorFlow Serving watches.
        version: a positive integer, or None for the next one (see `version_path`).
        service: the signatures' owner (`TranslationService`, `ClassificationService`).
        settings_name, settings: written as `assets.extra/<settings_name>` (JSON).
    """
    path = version_path(export_base, version)
    os.makedirs(export_base, exist_ok=True)
    # Serving ignores names that are not numbers: built under a hidden one, then renamed.
    with directory_written_whole(path) as staging:
        save_quietly(service.saveable(), staging, service.signatures())
        extra = os.path.join(staging, "assets.extra")
        os.makedirs(extra, exist_ok=True)
        with open(os.path.join(extra, settings_name), "w", encoding="utf-8") as file:
            json.dump(settings, file, indent=2)
    return path


def resolve_export(path):
    """`path` itself when it holds a SavedModel, else its highest numbered version."""
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return path
    versions = _versions(path)
    if not versions:
        raise FileNotFoundError(f"{path} holds neither a saved_model.pb nor numbered versions of one")
    return os.path.join(path, str(versions[-1]))


def load_export(path):
    """Load an export (a version directory, or a base: its highest version).

    A damaged export (a truncated `saved_model.pb` or variables file, say)
    raises a `DamagedFileError` naming the version directory.
    """
    # The WordPiece ops must be registered before the graph is loaded.
    import tensorflow_text  # noqa: F401

    version = resolve_export(path)
    try:
        return tf.saved_model.load(version)
    except Exception as error:  # protobuf, TensorFlow and OS errors alike: the message says which
        raise DamagedFileError(f"{version} is not a loadable SavedModel: {first_line(error)}") from None
