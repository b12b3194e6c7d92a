"""The sentence-transformers pipeline of a checkpoint, read and validated from its files: what
`SentenceTransformer(MODEL).encode(texts)` computes after the encoder, for the modules a BERT embedding checkpoint
uses, built as PyTorch modules (`hfbert.tools.sentence_transformers_modules`). `hfbert.tools.embedding.Embedder`
and parity's sentence statistics run it; sentence-transformers itself is never imported.

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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from converters.checkpoint_files import CheckpointTensors, read_weight_file
from converters.errors import CheckpointError
from converters.json_files import read_json, read_json_object
from converters.loading import non_finite
from hfbert.tools.sentence_transformers_modules import POOLINGS, Dense, Normalize, Pooling, SentenceModules, pool

# Dense and pool are re-exported from hfbert.tools.sentence_transformers_modules: their old import path.
__all__ = [
    "POOLINGS",
    "SUPPORTED_MODULES",
    "Dense",
    "FolderSettings",
    "Module",
    "Pipeline",
    "pool",
    "read_folder",
    "read_pipeline",
]

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


@dataclass
class Pipeline:
    """How texts are prepared for the encoder, and the modules that run after it (`modules`: pooling, Dense,
    Normalize; `modules(token_embeddings, attention_mask)` gives the embeddings); see the module docstring."""

    modules: SentenceModules
    max_length: int = 512
    prompt: str | None = None
    do_lower_case: bool = False
    source: str = ""  # where it came from
    overrides: list[str] = field(default_factory=list)  # what the caller's options changed
    prompts: dict[str, Any] | None = None  # config_sentence_transformers.json's, as read with modules.json (None: not)

    @property
    def pooling(self) -> tuple[str, ...]:
        return self.modules.pooling.modes

    @property
    def include_prompt(self) -> bool:
        return self.modules.pooling.include_prompt

    @property
    def normalize(self) -> bool:
        return any(isinstance(module, Normalize) for module in self.modules)

    def describe(self) -> str:
        length = f"max_seq_length={self.max_length}" + (", do_lower_case" if self.do_lower_case else "")
        parts = [f"Transformer({length})"] + [module.describe() for module in self.modules]
        prompt = f"; prompt {self.prompt!r}" if self.prompt else ""
        overridden = f" (overridden: {', '.join(self.overrides)})" if self.overrides else ""
        return f"{self.source}: {' -> '.join(parts)}{prompt}{overridden}"


def _pooling(directory: Path, hidden_size: int) -> Pooling:
    config_file = directory / "config.json"
    if not config_file.is_file():  # sentence-transformers cannot build the module either: never a silent mean
        raise ValueError(f"{config_file}: missing; modules.json lists a Pooling module here, which needs its config")
    config = read_json_object(config_file)
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
    # include_prompt by truthiness, as sentence-transformers' `if not ...`
    return Pooling(modes, hidden_size, include_prompt=bool(config.get("include_prompt", True)))


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
    config = read_json_object(config_file, missing_ok=True)
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
    residual = None
    if config.get("use_residual", False):
        residual = nn.Identity() if inputs == outputs else nn.Linear(inputs, outputs, bias=False, device="meta")
    dense = Dense(nn.Linear(inputs, outputs, bias=bias, device="meta"), activation, residual)
    # The module's state as sentence-transformers saves and loads it: the linear layers' weights, and the parameters
    # of an activation that has some (PReLU's slope).
    expected = {name: tuple(value.shape) for name, value in dense.state_dict().items()}
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
    dense.load_state_dict({name: tensors.tensors[name].float() for name in expected}, assign=True)
    return dense.eval()


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


# Folders sentence-transformers' other classes write: their modules.json describes a reranker or a sparse encoder,
# which `SentenceTransformer(folder)` would silently mean-pool instead; the tool that runs each.
OTHER_TOOLS = {"CrossEncoder": "hfbert rerank (hfbert.CrossEncoder)", "SparseEncoder": "hfbert embed --sparse"}


def read_pipeline(
    directory: Path, hidden_size: int, max_position_embeddings: int, tokenizer_max_length: int
) -> Pipeline:
    """The sentence-transformers pipeline a checkpoint directory describes (see the module docstring); for a
    checkpoint without modules.json, the one SentenceTransformer builds for a plain checkpoint."""
    directory = Path(directory)
    capped = min(tokenizer_max_length, max_position_embeddings)
    modules_file = directory / MODULES_FILE
    if not modules_file.is_file():
        return Pipeline(
            SentenceModules(Pooling(("mean",), hidden_size)),
            capped,
            source="no sentence-transformers modules.json (mean pooling, as SentenceTransformer does)",
        )
    written_by = read_json_object(directory / PROMPTS_FILE, missing_ok=True).get("model_type", "SentenceTransformer")
    if written_by in OTHER_TOOLS:
        raise ValueError(
            f"{directory}: written by sentence-transformers' {written_by} ({PROMPTS_FILE}), not a sentence embedding "
            f"model: use {OTHER_TOOLS[written_by]}"
        )
    folder = read_folder(directory)
    for module in folder.modules:
        package, _, _ = module.type.rpartition(".")
        if not package.startswith(_MODULE_PACKAGES) or module.name not in SUPPORTED_MODULES:
            raise ValueError(
                f"{modules_file}: module {module.type!r} is not one hfbert embed runs (it runs "
                f"{', '.join(SUPPORTED_MODULES)}); use sentence-transformers itself for this checkpoint"
            )
    if folder.modules[0].name != "Transformer" or folder.modules[0].folder != directory:
        raise ValueError(f"{modules_file}: the first module must be the Transformer at the checkpoint's root")
    length = folder.max_seq_length
    max_length = capped if length is None else min(length, max_position_embeddings)
    modules: SentenceModules | None = None
    for module in folder.modules[1:]:
        name, module_folder = module.name, module.folder
        if name == "Transformer":
            raise ValueError(f"{modules_file}: a second Transformer module; hfbert embed runs one encoder")
        if name == "Pooling":
            if modules is not None:
                raise ValueError(f"{modules_file}: a second Pooling module")
            modules = SentenceModules(_pooling(module_folder, hidden_size))
        elif modules is None and name != "Dropout":
            raise ValueError(f"{modules_file}: {name} before Pooling; hfbert embed pools the token embeddings first")
        elif name == "Dense":
            modules.append(_dense(module_folder, modules.dimension))
        elif name == "Normalize":
            config_file = module_folder / "config.json"
            config = read_json_object(config_file, missing_ok=True)
            if config.get("module_input_name", "sentence_embedding") != "sentence_embedding":
                raise ValueError(f"{config_file}: hfbert embed normalizes the sentence embedding only")
            modules.append(Normalize())
    if modules is None:
        raise ValueError(f"{modules_file}: no Pooling module; hfbert embed returns one vector per text")
    pipeline = Pipeline(
        modules,
        max_length,
        do_lower_case=folder.do_lower_case,
        source="sentence-transformers (modules.json)",
        prompts=folder.prompts,
    )
    if folder.default_prompt_name is not None:
        pipeline.prompt = prompt_text(folder.prompts, folder.default_prompt_name, directory)
    return pipeline


PROMPTS_FILE = "config_sentence_transformers.json"


def checkpoint_prompts(directory: Path) -> tuple[dict[str, Any], str | None]:
    """config_sentence_transformers.json's prompts (name -> text) and default prompt name; ValueError naming the
    file and field when either has the wrong type (a list of prompts, a name that is no string)."""
    path = Path(directory) / PROMPTS_FILE
    config = read_json_object(path, missing_ok=True)
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


# The one reader of a folder's sentence-transformers files, for every tool: `read_pipeline` (SentenceTransformer)
# and `hfbert.tools.head_checkpoint.read_folder_settings` (CrossEncoder, SparseEncoder) build on what it reads.
MODULES_FILE = "modules.json"
TRANSFORMER_CONFIG = "sentence_bert_config.json"
# The packages sentence-transformers' module types live in, in every release that wrote them: 2.x-4.x
# (`sentence_transformers.models`), 5.x (`sentence_transformers.sparse_encoder.models`, `cross_encoder.*`) and
# 6.x (`sentence_transformers.base.modules`, `sentence_transformers.sparse_encoder.modules`, ...).
MODULE_PACKAGES = (
    "sentence_transformers.models",
    "sentence_transformers.base.",
    "sentence_transformers.sentence_transformer.",
    "sentence_transformers.sparse_encoder.",
    "sentence_transformers.cross_encoder.",
)


@dataclass
class Module:
    """One modules.json entry: the class name of its type, the type as written, and its folder."""

    name: str
    type: str
    folder: Path


@dataclass
class FolderSettings:
    """A folder's sentence-transformers files, each read and checked once (`read_folder`): modules.json's
    `modules`, sentence_bert_config.json (`transformer`: its `max_seq_length`, `do_lower_case`),
    config_sentence_transformers.json (`model_config`: its prompts and default prompt name). `modules` is None
    where a job builds its default modules (no modules.json, or one of another class: `read_folder_settings`)."""

    modules: list[Module] | None = None
    max_seq_length: int | None = None
    do_lower_case: bool = False
    transformer: dict[str, Any] = field(default_factory=dict)  # sentence_bert_config.json
    model_config: dict[str, Any] = field(default_factory=dict)  # config_sentence_transformers.json
    prompts: dict[str, Any] = field(default_factory=dict)
    default_prompt_name: str | None = None


def read_folder(directory: Path) -> FolderSettings:
    """The sentence-transformers files of `directory`, which holds a modules.json; ValueError naming the file and
    field for a malformed one."""
    directory = Path(directory)
    modules_file = directory / MODULES_FILE
    entries = read_json(modules_file)
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{modules_file}: expected a non-empty JSON list of modules")
    modules = [_module(entry, modules_file, directory) for entry in entries]
    transformer = read_json_object(directory / TRANSFORMER_CONFIG, missing_ok=True)
    length = transformer.get("max_seq_length")
    if length is not None and (not isinstance(length, int) or isinstance(length, bool) or length < 1):
        raise ValueError(f"{directory / TRANSFORMER_CONFIG}: max_seq_length {length!r}; expected a positive integer")
    prompts, default = checkpoint_prompts(directory)
    if default is not None and default not in prompts:
        raise ValueError(f"{directory / PROMPTS_FILE}: default_prompt_name {default!r} is not in prompts")
    return FolderSettings(
        modules=modules,
        max_seq_length=length,
        do_lower_case=bool(transformer.get("do_lower_case")),  # by truthiness, as sentence-transformers' `if`
        transformer=transformer,
        model_config=read_json_object(directory / PROMPTS_FILE, missing_ok=True),
        prompts=prompts,
        default_prompt_name=default,
    )


def _module(entry: Any, modules_file: Path, directory: Path) -> Module:
    if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
        raise ValueError(f"{modules_file}: each entry must be an object with a string 'type', got {entry!r}")
    module_type = entry["type"]
    package, _, name = module_type.rpartition(".")
    folder = entry.get("path", "")
    if not isinstance(folder, str) or Path(folder).is_absolute() or ".." in Path(folder).parts:
        raise ValueError(
            f"{modules_file}: module {module_type!r} has path {folder!r}; expected a folder inside the checkpoint"
        )
    # A type outside sentence-transformers is custom code, which hfbert never runs: no class name of it is trusted.
    return Module(name if package.startswith(MODULE_PACKAGES) else module_type, module_type, directory / folder)
