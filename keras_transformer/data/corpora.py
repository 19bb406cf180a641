"""Parallel corpora from disk: aligned text files, TSV, and Multi30k.

Every reader returns a list of `(source, target)` string pairs and fails with
an error that names the file and line when the input is wrong: a missing
file, files of different lengths, an empty line, bytes that are not UTF-8.
"""

import gzip
import os
import shutil
from pathlib import Path

from keras_transformer.saving import file_sha256

# The data that ships beside this repository (see ../shared/data/README.md).
_SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}.gz"
MULTI30K_SPLITS = {"train": "train", "val": "val", "test": "test_2016_flickr"}
# SHA-256 of the uncompressed files, where known; a download is checked against them.
MULTI30K_SHA256 = {
    "train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    "train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    "val.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    "val.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
}


class CorpusError(ValueError):
    """The corpus on disk cannot be used as it is; the message says where and why."""


def read_lines(path):
    """The lines of a UTF-8 text file, without line endings; no line may be empty."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    lines = []
    with open(path, "rb") as file:
        for number, raw in enumerate(file, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise CorpusError(
                    f"{path}, line {number}: bytes that are not UTF-8 ({error.reason} at byte {error.start})"
                ) from None
            line = line.rstrip("\r\n")
            if not line.strip():
                raise CorpusError(f"{path}, line {number}: empty line (every line must hold a sentence)")
            lines.append(line)
    return lines


def read_parallel_files(source_path, target_path):
    """Pairs from two aligned files: line i of one translates line i of the other."""
    sources, targets = read_lines(source_path), read_lines(target_path)
    if len(sources) != len(targets):
        raise CorpusError(
            f"parallel files differ in length: {source_path} has {len(sources)} lines, "
            f"{target_path} has {len(targets)}"
        )
    return list(zip(sources, targets))


def read_tsv(path):
    """Pairs from a file of `source<TAB>target` lines."""
    pairs = []
    for number, line in enumerate(read_lines(path), start=1):
        fields = line.split("\t")
        if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
            raise CorpusError(
                f"{path}, line {number}: expected 'source<TAB>target', found {len(fields)} field(s)"
            )
        pairs.append((fields[0], fields[1]))
    return pairs


def _download_multi30k_file(name, directory):
    """Fetch `name` (e.g. "train.de") into `directory`, via Keras' download cache."""
    import keras  # only needed for downloading

    archive = keras.utils.get_file(
        f"multi30k_{name}.gz", MULTI30K_URL.format(name=name), cache_subdir="datasets/multi30k"
    )
    target = Path(directory) / name
    target.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(archive, "rb") as compressed, open(target, "wb") as plain:
        shutil.copyfileobj(compressed, plain)
    expected = MULTI30K_SHA256.get(name)
    if expected and file_sha256(target) != expected:
        target.unlink()
        raise CorpusError(f"downloaded {name} does not match its checksum; try again")
    return target


def multi30k_directory(data_dir=None):
    """Where Multi30k lives: the argument, else $KERAS_TRANSFORMER_DATA/multi30k, else ../shared/data."""
    if data_dir:
        return Path(data_dir)
    if os.environ.get("KERAS_TRANSFORMER_DATA"):
        return Path(os.environ["KERAS_TRANSFORMER_DATA"]) / "multi30k"
    return _SHARED_DATA / "multi30k"


def multi30k_files(data_dir=None, direction="de-en", split="train", download=True, cache_dir=None):
    """`(source file, target file)` of a Multi30k task 1 split, oriented by `direction` ("de-en" or "en-de").

    Files `train`, `val` and `test_2016_flickr` `.en`/`.de` are read from
    `multi30k_directory(data_dir)`. A file that is not there is downloaded
    from the public Multi30k repository (when `download`) into `cache_dir`
    (default `~/.keras/datasets/multi30k`).
    """
    languages = direction.split("-")
    if sorted(languages) != ["de", "en"]:
        raise ValueError(f"direction must be 'de-en' or 'en-de', got {direction!r}")
    if split not in MULTI30K_SPLITS:
        raise ValueError(f"unknown Multi30k split {split!r}; choose from {sorted(MULTI30K_SPLITS)}")
    directory = multi30k_directory(data_dir)
    cache_dir = Path(cache_dir or Path.home() / ".keras" / "datasets" / "multi30k")
    paths = []
    for language in languages:
        name = f"{MULTI30K_SPLITS[split]}.{language}"
        local, cached = directory / name, cache_dir / name
        if local.is_file():
            paths.append(local)
        elif cached.is_file():
            paths.append(cached)
        elif download:
            paths.append(_download_multi30k_file(name, cache_dir))
        else:
            raise FileNotFoundError(f"Multi30k file {name} is in neither {directory} nor {cache_dir}")
    return tuple(paths)


def load_multi30k(data_dir=None, direction="de-en", splits=("train", "val"), download=True, cache_dir=None):
    """Multi30k task 1 pairs for each split (`multi30k_files`), as lists of `(source, target)`."""
    return {
        split: read_parallel_files(*multi30k_files(data_dir, direction, split, download, cache_dir))
        for split in splits
    }
