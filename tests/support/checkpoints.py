"""Checkpoints built from committed data: bert-base-uncased's exact file layout with random values, the same with
outlier hidden dimensions, and a bert-large-shaped one. The tests, the benchmarks and the numerical-contract
table (`benchmarks/numerical_contract.py`) all build from here, so the repository needs nothing beside it.

`data/bert-base-uncased/` holds what is public about google-bert/bert-base-uncased (see its README.md); the
real tensor values are not available offline, so every builder draws random ones in the real names, shapes
and dtypes.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

REFERENCE = Path(__file__).resolve().parent.parent / "data" / "bert-base-uncased"
TOKENIZER_FILES = ("vocab.txt", "tokenizer_config.json")

# Trained BERTs carry a few hidden dimensions with very large values (the "outlier dimensions" of quantization
# papers). A LayerNorm gain of 8 in two dimensions of every LayerNorm reproduces that: |hidden| reaches ~80.
OUTLIER_DIMENSIONS = (308, 381)
OUTLIER_GAIN = 8.0

# bert-large-uncased's shape; the names and everything else as in bert-base-uncased's file.
BERT_LARGE_SHAPE = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16}


def reference_layout() -> dict:
    """layout.json: every tensor name, shape and dtype of bert-base-uncased's real files."""
    return json.loads((REFERENCE / "layout.json").read_text())


def reference_config() -> dict:
    return json.loads((REFERENCE / "config.json").read_text())


def random_tensors(
    shapes: dict[str, list[int]], seed: int = 0, weight_std: float = 0.05, gain_std: float = 0.1
) -> dict[str, torch.Tensor]:
    """Values for the given names and shapes: LayerNorm gains (`*.gamma`) around 1, everything else N(0, std)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=generator)
        tensors[name] = 1.0 + gain_std * noise if name.endswith("gamma") else weight_std * noise
    return tensors


def bert_base_shapes() -> dict[str, list[int]]:
    specs = reference_layout()["model.safetensors.tensors"]
    assert all(spec["dtype"] == "F32" for spec in specs.values())
    return {name: spec["shape"] for name, spec in specs.items()}


def bert_large_shapes() -> dict[str, list[int]]:
    """bert-base's names and layout, scaled to bert-large: 24 layers of hidden 1024, intermediate 4096."""
    base = reference_config()
    resize = {base["hidden_size"]: BERT_LARGE_SHAPE["hidden_size"]}
    resize[base["intermediate_size"]] = BERT_LARGE_SHAPE["intermediate_size"]
    shapes = {}
    for name, shape in bert_base_shapes().items():
        shape = [resize.get(size, size) for size in shape]
        if ".layer." not in name:
            shapes[name] = shape
        elif ".layer.0." in name:
            for layer in range(BERT_LARGE_SHAPE["num_hidden_layers"]):
                shapes[name.replace(".layer.0.", f".layer.{layer}.")] = shape
    return shapes


# bert-base-uncased's file layout at a tiny size: 2 layers of hidden 96 (its 12 heads of 8), intermediate 384; the
# vocabulary, positions and token types as they are, so that its tokenizer files fit.
SMALL_LAYOUT_SHAPE = {"hidden_size": 96, "intermediate_size": 384, "num_hidden_layers": 2}


def small_layout_shapes() -> dict[str, list[int]]:
    """bert-base's names, order and dtypes, scaled to SMALL_LAYOUT_SHAPE: layers 0 and 1 only."""
    base = reference_config()
    resize = {base["hidden_size"]: SMALL_LAYOUT_SHAPE["hidden_size"]}
    resize[base["intermediate_size"]] = SMALL_LAYOUT_SHAPE["intermediate_size"]
    layers = [f".layer.{index}." for index in range(SMALL_LAYOUT_SHAPE["num_hidden_layers"])]
    return {
        name: [resize.get(size, size) for size in shape]
        for name, shape in bert_base_shapes().items()
        if ".layer." not in name or any(layer in name for layer in layers)
    }


def small_layout_config() -> dict:
    return {**reference_config(), **SMALL_LAYOUT_SHAPE}


def write_small_layout(directory: Path, seed: int = 0, outliers: bool = False) -> dict[str, torch.Tensor]:
    """bert-base-uncased's file layout (tensor names, dtypes, config.json's fields, tokenizer files) at the tiny
    SMALL_LAYOUT_SHAPE, random values as `write_bert_base_layout` draws them; `outliers` as there, in the same
    places relative to the width."""
    tensors = random_tensors(small_layout_shapes(), seed)
    if outliers:
        scale = SMALL_LAYOUT_SHAPE["hidden_size"] / reference_config()["hidden_size"]
        add_outlier_dimensions(tensors, tuple(int(dimension * scale) for dimension in OUTLIER_DIMENSIONS))
    write_checkpoint(directory, tensors, small_layout_config())
    return tensors


@dataclass
class Layout:
    """bert-base-uncased's file layout, at its own size ("bert-base") or the small one ("small layout"), through the
    session fixtures that write it (`fixture`: pytest's `request.getfixturevalue`)."""

    name: str
    fixture: Callable[[str], object]

    @property
    def prefix(self) -> str:
        return "bert_base" if self.name == "bert-base" else "small_layout"

    @property
    def safetensors(self) -> Path:
        return self.fixture(f"{self.prefix}_safetensors_dir")

    @property
    def pickle(self) -> Path:
        return self.fixture(f"{self.prefix}_pickle_dir")

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        return self.fixture(f"{self.prefix}_tensors")

    @property
    def config(self) -> dict:
        return reference_config() if self.name == "bert-base" else small_layout_config()

    @property
    def small(self) -> bool:
        return self.name != "bert-base"

    def write(self, directory: Path, seed: int = 0) -> dict[str, torch.Tensor]:
        """Another checkpoint of this layout and size, drawn with `seed`."""
        return (
            write_bert_base_layout(directory, seed) if self.name == "bert-base" else write_small_layout(directory, seed)
        )


def add_outlier_dimensions(
    tensors: dict[str, torch.Tensor], dimensions: tuple[int, ...] = OUTLIER_DIMENSIONS
) -> dict[str, torch.Tensor]:
    for name, tensor in tensors.items():
        if name.endswith("LayerNorm.gamma"):
            tensor[list(dimensions)] = OUTLIER_GAIN
    return tensors


def write_checkpoint(directory: Path, tensors: dict[str, torch.Tensor], config: dict | None = None) -> Path:
    """model.safetensors, config.json (bert-base-uncased's byte-exact one unless `config` is given) and the
    tokenizer files."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    write_config_and_tokenizer(directory, config)
    return directory


def write_config_and_tokenizer(directory: Path, config: dict | None = None) -> None:
    if config is None:
        shutil.copy(REFERENCE / "config.json", directory / "config.json")
    else:
        (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copy(REFERENCE / name, directory / name)


def write_bert_base_layout(directory: Path, seed: int = 0, outliers: bool = False) -> dict[str, torch.Tensor]:
    """The exact tensor names, shapes and dtypes of google-bert/bert-base-uncased's model.safetensors with random
    values (weights N(0, 0.05), LayerNorm gains 1 + 0.1 N(0, 1)), its byte-exact config.json and tokenizer files.
    `outliers`: every LayerNorm gain is 8 in two hidden dimensions, as trained BERTs' outlier dimensions."""
    tensors = random_tensors(bert_base_shapes(), seed)
    if outliers:
        add_outlier_dimensions(tensors)
    write_checkpoint(directory, tensors)
    return tensors


def write_bert_large_shape(directory: Path, seed: int = 0) -> Path:
    """bert-large-uncased's shape (24 layers, hidden 1024) in bert-base-uncased's file layout, random values."""
    config = {**reference_config(), **BERT_LARGE_SHAPE}
    return write_checkpoint(directory, random_tensors(bert_large_shapes(), seed), config)


def write_bert_base_pickle(directory: Path, tensors: dict[str, torch.Tensor], config: dict | None = None) -> None:
    """The 207-key pytorch_model.bin of bert-base-uncased, in its key order, with the decoder weight sharing
    storage with the word embeddings as in the real file. `tensors` of the small layout (and its `config`): the keys
    of its layers, in the same order."""
    layout = reference_layout()
    state = {}
    for name in layout["pytorch_model.bin.keys_in_order"]:
        shared_with = layout["files"]["pytorch_model.bin"]["shared_storage"].get(name)
        if (shared_with or name) in tensors:
            state[name] = tensors[shared_with] if shared_with else tensors[name]
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(state, directory / "pytorch_model.bin")
    write_config_and_tokenizer(directory, config)


def copy_checkpoint(source: Path, destination: Path, tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """Copy config.json (+ tokenizer files); write `tensors` (default: the source's) as model.safetensors."""
    from safetensors.torch import load_file, save_file

    destination.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        if file.is_file() and file.suffix in (".json", ".txt") and "index" not in file.name:
            shutil.copy(file, destination / file.name)
    if tensors is None:
        tensors = load_file(source / "model.safetensors")
    save_file(tensors, destination / "model.safetensors")
    return destination
