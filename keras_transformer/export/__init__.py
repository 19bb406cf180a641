"""Export a trained translator, text classifier or language model as a SavedModel that TensorFlow Serving runs
(or a translator as a CTranslate2 model)."""

from keras_transformer.backends import require_tensorflow

require_tensorflow("keras_transformer.export", "a SavedModel is a TensorFlow graph")

from keras_transformer.export.classifier import export_classifier
from keras_transformer.export.ctranslate2 import CTranslate2Translator, export_ctranslate2
from keras_transformer.export.language_model import GenerationService, export_language_model
from keras_transformer.export.translator import SIGNATURES, TranslationService, export_translator
from keras_transformer.export.versions import load_export, resolve_export, version_path

__all__ = [
    "CTranslate2Translator",
    "GenerationService",
    "SIGNATURES",
    "TranslationService",
    "export_classifier",
    "export_ctranslate2",
    "export_language_model",
    "export_translator",
    "load_export",
    "resolve_export",
    "version_path",
]
