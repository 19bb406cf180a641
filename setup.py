"""Packaging for keras-transformer."""

from pathlib import Path

from setuptools import find_packages, setup

# What a device needs to run a builtin LiteRT export, one requirement a line (comments aside).
DEVICE_REQUIREMENTS = [line.strip() for line in Path(__file__).with_name("device-requirements.txt").read_text().splitlines()
                       if line.strip() and not line.startswith("#")]

setup(
    name="keras-transformer",
    version="0.1.0",
    description='"Attention Is All You Need" as readable, production-ready Keras 3 layers',
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["keras_transformer", "keras_transformer.*"]),
    # The attention explorer's page, served by the TensorBoard plugin and inlined by `plot-attention --html`;
    # the web page `export --format web` writes, and the npm packages it pins.
    package_data={"keras_transformer.tensorboard_plugin": ["static/*.js", "static/*.css"],
                  "keras_transformer.export.web": ["page/*"]},
    python_requires=">=3.10",
    install_requires=[
        "tensorflow~=2.21.0",
        "keras>=3.15",
        "tensorflow-text~=2.21.0",
        "tensorboard",
        "numpy",
        "sacrebleu>=2.4",
        "matplotlib",
        # Pretrained checkpoints' weights, read as NumPy arrays (no PyTorch needed).
        "safetensors",
        # SentencePiece's model format: a BPE model's character model and merges for a LiteRT export.
        "sentencepiece>=0.2",
    ],
    extras_require={
        # The gRPC client of examples/serving_client.py.
        "serving": ["tensorflow-serving-api~=2.21.0"],
        # `export --format ctranslate2` and `translate --ctranslate2`: CTranslate2 as a deployment target.
        "ctranslate2": ["ctranslate2>=4.5"],
        # `translate --litert`: the LiteRT runtime for `export --format litert` (keras_transformer.on_device),
        # and the host tokenizer libraries a builtin file (`--ops builtin`) runs with.
        "litert": DEVICE_REQUIREMENTS,
        # playwright drives Debian's chromium in the attention explorer's test (no browser download).
        # ctranslate2: the CTranslate2 export is tested too. jax: the layer and model tests run on it too.
        "dev": [
            "pytest>=8", "pytest-xdist", "tensorflow-serving-api~=2.21.0", "playwright", "ctranslate2>=4.5", "jax>=0.4.36",
            *DEVICE_REQUIREMENTS,
        ],
        # `make bench`: the keras-hub and CTranslate2 contenders, and PyTorch's nn.Transformer.
        "bench": ["keras-hub>=0.20", "ctranslate2>=4.5"],
        "bench-torch": ["torch>=2.4"],
    },
    entry_points={
        "console_scripts": ["keras-transformer=keras_transformer.cli:main"],
        "tensorboard_plugins": ["attention = keras_transformer.tensorboard_plugin.plugin:AttentionPlugin"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
