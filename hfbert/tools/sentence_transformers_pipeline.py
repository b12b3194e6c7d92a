"""The sentence-transformers pipeline of a checkpoint, read from its files and run in plain PyTorch: what
`SentenceTransformer(MODEL).encode(texts)` computes after the encoder, for the modules a BERT embedding checkpoint
uses. `hfbert.tools.embedding.Embedder` runs it; sentence-transformers itself is never imported.

`read_pipeline(directory, ...)` reads `modules.json` and runs, in its order: Transformer (truncation at
`max_seq_length`, `do_lower_case`), Pooling (`cls`, `max`, `mean`, `mean_sqrt_len_tokens`, `weightedmean`,
`lasttoken`, or several concatenated; `include_prompt`), Dense (linear layer, a torch.nn activation, optional
residual) and Normalize; Dropout is the identity at inference. Anything else is refused by name. Both on-disk
formats are read:

- the one most Hub checkpoints carry: module types `sentence_transformers.models.*`, `1_Pooling/config.json` with
  `pooling_mode_mean_tokens: true`-style booleans, `max_seq_length` in `sentence_bert_config.json`, an empty or
  absent `2_Normalize/`, Dense weights in `pytorch_model.bin`;
- the one sentence-transformers 6.x writes: types under `sentence_transformers.base.modules` /
  `sentence_transformers.sentence_transformer.modules`, `{"embedding_dimension", "pooling_mode": "max",
  "include_prompt"}`, the length as `model_max_length` in `tokenizer_config.json`, a config.json in every module
  folder, Dense weights in `model.safetensors`.

The length follows sentence-transformers: `max_seq_length` when given, else the tokenizer's `model_max_length`
capped at `max_position_embeddings`. A default prompt (`config_sentence_transformers.json`: `prompts`,
`default_prompt_name`) is prepended, as `encode` does. A checkpoint without `modules.json` gets what
`SentenceTransformer` builds for a plain one: mean pooling, no normalisation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from converters.checkpoint_files import CheckpointTensors, read_weight_file
from converters.errors import CheckpointError
from converters.loading import non_finite

# sentence-transformers' pooling modes, in the order its legacy booleans concatenate them.
POOLINGS = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# Module types of modules.json by their class name; the package paths of both formats are accepted.
_MODULE_PACKAGES = ("sentence_transformers.models", "sentence_transformers.base", "sentence_transformers.sentence_")
SUPPORTED_MODULES = ("Transformer", "Pooling", "Dense", "Normalize", "Dropout")
# The activations a Dense module may name: torch.nn's activation modules that sentence-transformers can build
# without arguments (it calls the class with none), and Identity. A fixed table: a name is looked up here, never
# imported (an import by name would run any module torch ships, command-line tools included).
_ACTIVATION_CLASSES = (
    nn.CELU, nn.ELU, nn.GELU, nn.GLU, nn.Hardshrink, nn.Hardsigmoid, nn.Hardswish, nn.Hardtanh, nn.Identity,
    nn.LeakyReLU, nn.LogSigmoid, nn.LogSoftmax, nn.Mish, nn.PReLU, nn.ReLU, nn.ReLU6, nn.RReLU, nn.SELU, nn.SiLU,
    nn.Sigmoid, nn.Softmax, nn.Softmax2d, nn.Softmin, nn.Softplus, nn.Softshrink, nn.Softsign, nn.Tanh,
    nn.Tanhshrink,
)  # fmt: skip
# Each by the names that import it in sentence-transformers: the full one its save writes
# ("torch.nn.modules.activation.Tanh") and the public ones ("torch.nn.Tanh", "torch.nn.modules.Tanh").
ACTIVATIONS = {
    f"{prefix}.{cls.__name__}": cls
    for cls in _ACTIVATION_CLASSES
    for prefix in (cls.__module__, "torch.nn", "torch.nn.modules")
}


__all__ = ["POOLINGS", "SUPPORTED_MODULES", "Dense", "Pipeline", "pool", "read_pipeline"]

# -- the pipeline -------------------------------------------------------------------------------------------


def pool(
    token_embeddings: Tensor, attention_mask: Tensor, pooling: str | Sequence[str], prompt_length: int = 0
) -> Tensor:
    """(batch, sequence, hidden) -> (batch, hidden x modes), sentence-transformers' `Pooling` formulas (several
    modes are concatenated in the given order). `prompt_length` > 0: that many leading tokens are left out, as
    `include_prompt=False` does."""
    modes = (pooling,) if isinstance(pooling, str) else tuple(pooling)
    original_mask = attention_mask
    if prompt_length:
        attention_mask = attention_mask.clone()
        attention_mask[:, :prompt_length] = 0  # right padding: the prompt is the first tokens
    accumulation = torch.float32 if token_embeddings.dtype in (torch.float16, torch.bfloat16) else None
    accumulation = accumulation or token_embeddings.dtype
    vectors = []
    for mode in modes:
        if mode == "cls":
            first = attention_mask.to(torch.int).argmax(dim=1)
            vectors.append(token_embeddings[torch.arange(len(first)), first])
        elif mode == "max":
            mask = attention_mask.unsqueeze(-1).expand_as(token_embeddings)
            vectors.append(token_embeddings.masked_fill(mask == 0, float("-inf")).max(dim=1).values)
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            mask = attention_mask.unsqueeze(-1).to(token_embeddings.dtype)
            total = (token_embeddings * mask).sum(dim=1, dtype=accumulation)
            count = torch.clamp(mask.sum(dim=1, dtype=accumulation), min=1e-9)
            vectors.append((total / (count if mode == "mean" else count.sqrt())).to(token_embeddings.dtype))
        elif mode == "weightedmean":
            mask = attention_mask.unsqueeze(-1).to(accumulation)
            positions = torch.arange(1, token_embeddings.shape[1] + 1, device=mask.device, dtype=accumulation)
            weights = positions.view(1, -1, 1) - original_mask.to(torch.int32).argmax(dim=1).view(-1, 1, 1)
            weighted = mask * weights
            total = (token_embeddings * weighted).sum(dim=1)
            vectors.append((total / torch.clamp(weighted.sum(dim=1), min=1e-9)).to(token_embeddings.dtype))
        elif mode == "lasttoken":
            length = token_embeddings.shape[1]
            values, indices = attention_mask.flip(1).max(1)
            indices = torch.where(values == 0, length - 1, indices)
            masked = token_embeddings * attention_mask.unsqueeze(-1).to(token_embeddings.dtype)
            vectors.append(masked[torch.arange(len(indices)), length - indices - 1])
        else:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, not {mode!r}")
    return torch.cat(vectors, dim=-1)


@dataclass
class Dense:
    """sentence-transformers' Dense module: activation(linear(x)) (+ x, or a projection of x, with a residual)."""

    linear: nn.Linear
    activation: nn.Module
    residual: nn.Linear | nn.Identity | None = None
    name: str = "Dense"

    def __call__(self, vectors: Tensor) -> Tensor:
        output = self.activation(self.linear(vectors))
        return output if self.residual is None else output + self.residual(vectors)

    def describe(self) -> str:
        activation = type(self.activation).__name__
        return f"Dense({self.linear.in_features}->{self.linear.out_features}, {activation})"


@dataclass
class Pipeline:
    """What runs after the encoder, and how texts are prepared for it; see the module docstring."""

    pooling: tuple[str, ...] = ("mean",)
    max_length: int = 512
    steps: list[Any] = field(default_factory=list)  # Dense modules and the string "Normalize", in order
    include_prompt: bool = True
    prompt: str | None = None
    do_lower_case: bool = False
    source: str = ""  # where it came from
    overrides: list[str] = field(default_factory=list)  # what the caller's options changed

    @property
    def normalize(self) -> bool:
        return "Normalize" in self.steps

    def describe(self) -> str:
        length = f"max_seq_length={self.max_length}" + (", do_lower_case" if self.do_lower_case else "")
        pooling = "+".join(self.pooling) + ("" if self.include_prompt else ", prompt excluded")
        parts = [f"Transformer({length})", f"Pooling({pooling})"]
        parts += [step if isinstance(step, str) else step.describe() for step in self.steps]
        text = f"{self.source}: {' -> '.join(parts)}"
        if self.prompt:
            text += f"; prompt {self.prompt!r}"
        return text + (f" (overridden: {', '.join(self.overrides)})" if self.overrides else "")


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; {} when there is no such file; ValueError naming the file otherwise."""
    try:
        value = _load_json(path)
    except FileNotFoundError:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return value


def _load_json(path: Path) -> Any:
    """The JSON value in `path`; ValueError naming the file for bad UTF-8, bad JSON, integers of more than 4300
    digits and nesting deeper than Python's recursion limit (100,000 brackets)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        reason = " ".join(str(error).split())[:200] if isinstance(error, ValueError) else "nested too deeply"
        raise ValueError(f"{path}: not valid JSON ({reason})") from None


def _module_kind(entry: Any, path: Path) -> tuple[str, str]:
    """(class name, folder) of one modules.json entry; ValueError for anything but a supported module."""
    if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
        raise ValueError(f"{path}: each entry must be an object with a string 'type', got {entry!r}")
    module_type = entry["type"]
    package, _, name = module_type.rpartition(".")
    if not package.startswith(_MODULE_PACKAGES) or name not in SUPPORTED_MODULES:
        raise ValueError(
            f"{path}: module {module_type!r} is not one hfbert embed runs (it runs "
            f"{', '.join(SUPPORTED_MODULES)}); use sentence-transformers itself for this checkpoint"
        )
    folder = entry.get("path", "")
    if not isinstance(folder, str) or Path(folder).is_absolute() or ".." in Path(folder).parts:
        raise ValueError(f"{path}: module {module_type!r} has path {folder!r}; expected a folder inside the checkpoint")
    return name, folder


def _pooling_config(directory: Path, hidden_size: int) -> tuple[tuple[str, ...], bool]:
    config_file = directory / "config.json"
    if not config_file.is_file():  # sentence-transformers cannot build the module either: never a silent mean
        raise ValueError(f"{config_file}: missing; modules.json lists a Pooling module here, which needs its config")
    config = read_json(config_file)
    if "pooling_mode" not in config:
        # The legacy flags, read as sentence-transformers reads them: by truthiness (older configs write 1 / 0);
        # none set means mean.
        modes = tuple(name for key, name in _LEGACY_POOLING_KEYS.items() if config.get(key)) or ("mean",)
    else:
        mode = config["pooling_mode"]
        modes = (mode,) if isinstance(mode, str) else tuple(mode) if isinstance(mode, list) else ()
        if not modes or any(m not in POOLINGS for m in modes):
            raise ValueError(f"{config_file}: pooling_mode {mode!r}; expected one of {', '.join(POOLINGS)} or a list")
    dimension = config.get("embedding_dimension", config.get("word_embedding_dimension", hidden_size))
    if dimension != hidden_size:
        raise ValueError(
            f"{config_file}: pooling over dimension {dimension}, but the encoder's hidden size is {hidden_size}"
        )
    return modes, bool(config.get("include_prompt", True))  # truthiness, as sentence-transformers' `if not ...`


def _activation(name: Any, config_file: Path) -> nn.Module:
    """The activation module a Dense config names (`ACTIVATIONS`), in eval mode, as sentence-transformers builds it
    without trust_remote_code: the class called with no arguments."""
    if name is None:
        return nn.Tanh()  # Dense's default
    activation = ACTIVATIONS.get(name) if isinstance(name, str) else None
    if activation is None:
        raise ValueError(
            f"{config_file}: activation_function {name!r} is not one hfbert runs (torch.nn's activation modules, "
            f"e.g. 'torch.nn.modules.activation.Tanh', and Identity)"
        )
    return activation().eval()


def _dense(directory: Path, in_features: int) -> Dense:
    config_file = directory / "config.json"
    config = read_json(config_file)
    try:
        inputs, outputs, bias = int(config["in_features"]), int(config["out_features"]), bool(config.get("bias", True))
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{config_file}: a Dense module needs integer in_features and out_features") from None
    for key in ("module_input_name", "module_output_name"):
        if config.get(key, "sentence_embedding") not in ("sentence_embedding", None):
            raise ValueError(f"{config_file}: {key} {config[key]!r}; hfbert embed runs Dense on the sentence embedding")
    if inputs != in_features:
        raise ValueError(f"{config_file}: in_features {inputs}, but the embedding before it has {in_features}")
    activation = _activation(config.get("activation_function"), config_file)
    tensors = _dense_weights(directory)
    linear = nn.Linear(inputs, outputs, bias=bias, device="meta")
    expected = {"linear.weight": (outputs, inputs)} | ({"linear.bias": (outputs,)} if bias else {})
    # An activation with parameters (PReLU's slope) stores them in the Dense module's state, as sentence-transformers
    # saves and loads it.
    expected |= {f"activation_function.{key}": tuple(value.shape) for key, value in activation.state_dict().items()}
    residual: nn.Module | None = None
    if config.get("use_residual", False):
        if inputs == outputs:
            residual = nn.Identity()
        else:
            residual = nn.Linear(inputs, outputs, bias=False, device="meta")
            expected["residual.weight"] = (outputs, inputs)
    for name, shape in expected.items():
        tensor = tensors.tensors.get(name)
        if tensor is None or tuple(tensor.shape) != shape or not tensor.is_floating_point():
            found = "missing" if tensor is None else f"{tuple(tensor.shape)} {tensor.dtype}"
            raise CheckpointError(
                f"{directory}: Dense weight {name!r} should be a float tensor of shape {shape}, is {found}"
            )
        problem = non_finite(tensor)
        if problem:
            raise CheckpointError(f"{tensors.origin[name]}: Dense weight {name!r} {problem}")
    unexpected = sorted(set(tensors.tensors) - set(expected))
    if unexpected:  # sentence-transformers refuses them too
        raise CheckpointError(f"{tensors.files[0]}: tensor {unexpected[0]!r} is not a weight of this Dense module")
    state = {name: tensors.tensors[name].float() for name in expected}
    linear.load_state_dict(_part(state, "linear."), assign=True)
    if isinstance(residual, nn.Linear):
        residual.load_state_dict(_part(state, "residual."), assign=True)
    activation.load_state_dict(_part(state, "activation_function."))
    return Dense(linear.eval(), activation, residual)


def _part(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The entries of `state` under `prefix`, named as the submodule names them."""
    return {name.removeprefix(prefix): tensor for name, tensor in state.items() if name.startswith(prefix)}


def _dense_weights(directory: Path) -> CheckpointTensors:
    """The Dense module's tensors, read and checked as the encoder's are (`converters.checkpoint_files`):
    safetensors validated by the library, pickles only with weights_only=True and every tensor's storage holding
    the values its shape claims (no 4-byte file expanding to gigabytes, no meta tensors)."""
    tensors = CheckpointTensors()
    for name in ("model.safetensors", "pytorch_model.bin"):  # sentence-transformers' order
        if (directory / name).is_file():
            read_weight_file(directory / name, tensors)
            return tensors
    raise ValueError(f"{directory}: a Dense module without weights (model.safetensors or pytorch_model.bin)")


def read_pipeline(
    directory: Path, hidden_size: int, max_position_embeddings: int, tokenizer_max_length: int
) -> Pipeline:
    """The sentence-transformers pipeline a checkpoint directory describes (see the module docstring); for a
    checkpoint without modules.json, the one SentenceTransformer builds for a plain checkpoint."""
    directory = Path(directory)
    capped = min(tokenizer_max_length, max_position_embeddings)
    modules_file = directory / "modules.json"
    if not modules_file.is_file():
        return Pipeline(
            ("mean",),
            capped,
            source="no sentence-transformers modules.json (mean pooling, as SentenceTransformer does)",
        )
    entries = _load_json(modules_file)
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{modules_file}: expected a non-empty JSON list of modules")
    kinds = [_module_kind(entry, modules_file) for entry in entries]
    if kinds[0][0] != "Transformer" or kinds[0][1] not in ("", "."):
        raise ValueError(f"{modules_file}: the first module must be the Transformer at the checkpoint's root")
    transformer = read_json(directory / "sentence_bert_config.json")
    length = transformer.get("max_seq_length")
    if length is None:
        max_length = capped
    elif isinstance(length, int) and not isinstance(length, bool) and length > 0:
        max_length = min(length, max_position_embeddings)
    else:
        raise ValueError(
            f"{directory / 'sentence_bert_config.json'}: max_seq_length {length!r}; expected a positive integer"
        )
    # Truthiness, as sentence-transformers' `if do_lower_case:`.
    pipeline = Pipeline(max_length=max_length, do_lower_case=bool(transformer.get("do_lower_case")))
    pipeline.source = "sentence-transformers (modules.json)"
    dimension, pooled = hidden_size, False
    for name, folder in kinds[1:]:
        if name == "Transformer":
            raise ValueError(f"{modules_file}: a second Transformer module; hfbert embed runs one encoder")
        if name == "Pooling":
            if pooled:
                raise ValueError(f"{modules_file}: a second Pooling module")
            pipeline.pooling, pipeline.include_prompt = _pooling_config(directory / folder, hidden_size)
            dimension, pooled = hidden_size * len(pipeline.pooling), True
        elif not pooled and name != "Dropout":
            raise ValueError(f"{modules_file}: {name} before Pooling; hfbert embed pools the token embeddings first")
        elif name == "Dense":
            dense = _dense(directory / folder, dimension)
            pipeline.steps.append(dense)
            dimension = dense.linear.out_features
        elif name == "Normalize":
            config = read_json(directory / folder / "config.json")
            if config.get("module_input_name", "sentence_embedding") != "sentence_embedding":
                raise ValueError(
                    f"{directory / folder / 'config.json'}: hfbert embed normalizes the sentence embedding only"
                )
            pipeline.steps.append("Normalize")
    if not pooled:
        raise ValueError(f"{modules_file}: no Pooling module; hfbert embed returns one vector per text")
    table, default = checkpoint_prompts(directory)
    if default is not None:
        if default not in table:
            raise ValueError(f"{directory / PROMPTS_FILE}: default_prompt_name {default!r} is not in prompts")
        pipeline.prompt = prompt_text(table, default, directory)
    return pipeline


PROMPTS_FILE = "config_sentence_transformers.json"


def checkpoint_prompts(directory: Path) -> tuple[dict[str, Any], str | None]:
    """config_sentence_transformers.json's prompts (name -> text) and default prompt name; ValueError naming the
    file and field when either has the wrong type (a list of prompts, a name that is no string)."""
    path = Path(directory) / PROMPTS_FILE
    config = read_json(path)
    table = config.get("prompts") or {}
    if not isinstance(table, dict):
        raise ValueError(f"{path}: prompts is {_shown(table)}; expected an object of prompt name -> text")
    default = config.get("default_prompt_name")
    if default is not None and not isinstance(default, str):
        raise ValueError(f"{path}: default_prompt_name is {_shown(default)}; expected a prompt name (a string)")
    return table, default


def prompt_text(table: dict[str, Any], name: str, directory: Path) -> str | None:
    """The text of prompt `name` of `checkpoint_prompts`' table (None for an empty one); ValueError naming the file
    when it is not a string."""
    text = table[name]
    if text is not None and not isinstance(text, str):
        raise ValueError(f"{Path(directory) / PROMPTS_FILE}: prompt {name!r} is {_shown(text)}; expected a string")
    return text or None


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."
