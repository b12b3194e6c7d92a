"""`EncoderConfig`, what every member's config shares, and `BertConfig`, a typed mirror of a BERT `config.json`.

`EncoderConfig` holds the fields every transformers config has that its users set (`return_dict`, `dtype`, the
labels, `chunk_size_feed_forward`, `architectures`, the special token ids) and the machinery: reading config.json
into the member's class its `model_type` names, validation, saving. It declares no shape: each member's class
declares its own fields with transformers' names and defaults (DistilBERT's `dim` and `n_layers` as much as BERT's
`hidden_size`), and names which of them the common checks cover (`positive_integers`, `probabilities`, ...) and
which read under the common names (`attribute_map`, as transformers has it). Keys a class does not know
(`transformers_version`, `_name_or_path`, ...) are kept in `extra_fields` and written back unchanged, so a config
survives a load/save round trip byte for byte in meaning.

    >>> config = BertConfig(hidden_size=96, num_attention_heads=3, intermediate_size=200)
    >>> config.head_size
    32
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterator
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from converters.json_files import read_json
from converters.key_map import BERT_KEYS, KeyLayout
from hfbert.modeling.activations import ACTIVATIONS
from hfbert.modeling.positions import AbsolutePositions, PositionScheme


class ConfigError(ValueError):
    """A config.json (or keyword) value that hfbert cannot build an encoder from."""


# Keywords of transformers' `PretrainedConfig.from_pretrained` that configure the download, not the model.
LOADER_OPTIONS = frozenset(
    {
        "cache_dir",
        "force_download",
        "local_files_only",
        "proxies",
        "resume_download",
        "return_unused_kwargs",
        "token",
        "trust_remote_code",
        "use_auth_token",
    }
)


@dataclass
class EncoderConfig:
    """The fields and machinery every member's config shares; a member's class (`BertConfig`, `ModernBertConfig`,
    ...) adds its own fields. `EncoderConfig.from_pretrained` / `from_dict` read any member's config.json into that
    member's class, as transformers' AutoConfig does."""

    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    tie_word_embeddings: bool = True
    output_hidden_states: bool = False
    output_attentions: bool = False
    return_dict: bool = True
    dtype: torch.dtype | str | None = None
    chunk_size_feed_forward: int = 0
    architectures: list[str] | None = None
    # Task heads: labels of a classifier, and how BertForSequenceClassification picks its loss.
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None
    problem_type: str | None = None
    # Constructor shortcut, as in transformers: BertConfig(num_labels=3) makes LABEL_0..LABEL_2. Derived from
    # id2label afterwards and never written to config.json.
    num_labels: int | None = None
    model_type: str = ""
    extra_fields: dict[str, Any] = field(default_factory=dict, repr=False)
    # Where the config came from, so every error can name the file. Not part of config.json.
    source: str | None = field(default=None, repr=False, compare=False)
    # The attention kernel of the model built from this config ("sdpa" / "eager"), kept here as transformers keeps
    # it, so that `config._attn_implementation` reads and switches it. Runtime state: not part of config.json.
    _attn_implementation: str | None = field(default=None, repr=False, compare=False)
    # transformers' constructor spelling of it: BertConfig(attn_implementation="eager").
    attn_implementation: InitVar[str | None] = None
    # transformers' older name of `dtype`, accepted as transformers 5 accepts it (`dtype` wins when both are given);
    # never stored: `config.torch_dtype` reads `dtype` (the property set after the class).
    torch_dtype: InitVar[torch.dtype | str | None] = None
    # transformers' composite-model hook: an encoder's config holds no nested configs.
    sub_configs: ClassVar[dict[str, type]] = {}
    # What the common checks cover, by field name, in the member's own spelling: its shape (positive integers), its
    # dropout probabilities, other positive numbers (epsilons, the initializer's range), activation names, flags.
    positive_integers: ClassVar[tuple[str, ...]] = ()
    probabilities: ClassVar[tuple[str, ...]] = ()
    positive_numbers: ClassVar[tuple[str, ...]] = ()
    activations: ClassVar[tuple[str, ...]] = ()
    flags: ClassVar[tuple[str, ...]] = ("tie_word_embeddings", "output_hidden_states", "output_attentions")
    # The common names of facts the member spells its own way (transformers' `attribute_map`: DistilBERT's
    # {"hidden_size": "dim", ...}); reading or setting the common name reads or sets the member's field.
    attribute_map: ClassVar[dict[str, str]] = {}
    # The member's own fields that `hfbert inspect` shows beside the common facts (`inspect_facts`).
    inspect_fields: ClassVar[tuple[str, ...]] = ()
    # The field that sets the word embeddings' width, which `inputs_embeds` must have (ELECTRA's `embedding_size`,
    # projected to hidden_size after the embeddings).
    inputs_embeds_field: ClassVar[str] = "hidden_size"
    # What reading this member's files needs below the family table (family.py): how it counts positions
    # (positions.py) and how its checkpoints name their tensors (converters.key_map). A member's class sets its own.
    positions: ClassVar[PositionScheme] = AbsolutePositions()
    key_layout: ClassVar[KeyLayout] = BERT_KEYS
    # model_type -> config class: each member's class enters itself when it is defined (`__init_subclass__`), so
    # that a file is read into its member's class, as transformers' AutoConfig does, without this class naming any.
    members: ClassVar[dict[str, type[EncoderConfig]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Only a class that declares its own model_type is a member's; a user's subclass of a member's config
        # (no model_type of its own) changes nothing.
        model_type = cls.__dict__.get("model_type")
        if isinstance(model_type, str):
            EncoderConfig.members.setdefault(model_type, cls)

    def __post_init__(self, attn_implementation: str | None, torch_dtype: torch.dtype | str | None) -> None:
        if attn_implementation is not None:
            self._attn_implementation = attn_implementation
        if self.dtype is None:
            self.dtype = torch_dtype
        if self.dtype is not None:
            self.dtype = self._torch_dtype(self.dtype)
        if self.id2label is not None and not isinstance(self.id2label, dict):
            raise self._fail("id2label", f"must be an object of label index -> name, got {self.id2label!r}")
        if self.id2label is None or (self.num_labels is not None and self.num_labels != len(self.id2label)):
            count = self.num_labels if self.num_labels is not None else 2
            if not is_integer(count) or not 0 < count <= _MAX_LABELS:
                raise self._fail("num_labels", f"must be an integer in [1, {_MAX_LABELS}], got {count!r}")
            self.id2label = {index: f"LABEL_{index}" for index in range(count)}
            self.label2id = None
        if not all(isinstance(name, str) for name in self.id2label.values()):
            raise self._fail("id2label", f"values must be label names (strings), got {list(self.id2label.values())!r}")
        if self.label2id is not None and not isinstance(self.label2id, dict):
            raise self._fail("label2id", f"must be an object of label name -> index, got {self.label2id!r}")
        try:
            # JSON object keys are strings; transformers turns them back into ints.
            labels = {int(index): name for index, name in self.id2label.items()}
        except (TypeError, ValueError):
            raise self._fail("id2label", f"keys must be label indices, got {list(self.id2label)!r}") from None
        if len(labels) != len(self.id2label) or not labels:  # {"0": .., "00": ..} would silently lose a label
            raise self._fail("id2label", f"must map distinct label indices to names, got {self.id2label!r}")
        self.id2label = labels
        if self.label2id is None:
            self.label2id = {name: index for index, name in self.id2label.items()}
        self.num_labels = len(self.id2label)
        self.validate()
        object.__setattr__(self, "_constructed", True)

    def __setattr__(self, name: str, value: Any) -> None:
        name = type(self).attribute_map.get(name, name)
        super().__setattr__(name, value)
        # As transformers' `num_labels` setter: a new count after construction makes new labels (LABEL_0, ...), so
        # config.json (which stores id2label, not num_labels) describes the head the model builds.
        constructed = self.__dict__.get("_constructed", False)
        if name == "num_labels" and constructed and is_integer(value) and 0 < value != len(self.id2label or {}):
            super().__setattr__("id2label", {index: f"LABEL_{index}" for index in range(value)})
            super().__setattr__("label2id", {f"LABEL_{index}": index for index in range(value)})

    # -- validation -------------------------------------------------------------------------------------------
    def _fail(self, field_name: str, message: str) -> ConfigError:
        where = f"{self.source}: " if self.source else ""
        return ConfigError(f"{where}field '{field_name}' {message}")

    def _torch_dtype(self, value: Any) -> torch.dtype:
        """`value` (a torch.dtype or its name, "bfloat16") as a torch.dtype, as transformers reads `dtype`."""
        if isinstance(value, torch.dtype):
            return value
        dtype = getattr(torch, value, None) if isinstance(value, str) else None
        if not isinstance(dtype, torch.dtype):
            raise self._fail("dtype", f"must be a torch dtype or its name (such as 'float32'), got {value!r}")
        return dtype

    def validate(self) -> None:
        """Raise `ConfigError` naming the first field that cannot describe this member's encoder."""
        # The model type first: another family's file (DeBERTa's has no token types, type_vocab_size 0) fails on its
        # model_type, not on the first of its fields that this class reads differently.
        if not isinstance(self.model_type, str) or self.model_type not in self.members:
            members = ", ".join(map(repr, self.members))
            raise self._fail("model_type", f"is {self.model_type!r}; hfbert loads {members}")
        if not isinstance(self, self.members[self.model_type]):
            raise self._fail(
                "model_type",
                f"is {self.model_type!r}, which {type(self).__name__} does not describe; read it with "
                f"hfbert.AutoConfig (or {self.members[self.model_type].__name__})",
            )
        layers_field = self.attribute_map.get("num_hidden_layers", "num_hidden_layers")
        for name in self.positive_integers:
            value = getattr(self, name)
            if not is_integer(value) or value <= 0:
                raise self._fail(name, f"must be a positive integer, got {value!r}")
            limit = MAX_LAYERS if name == layers_field else MAX_SIZE
            if value > limit:
                raise self._fail(name, f"is {value}; hfbert supports at most {limit} (is config.json corrupt?)")
        for name in self.probabilities:
            value = getattr(self, name)
            if value is None and name == "classifier_dropout":
                continue
            if not is_number(value) or not 0.0 <= value <= 1.0:
                raise self._fail(name, f"must be a number in [0, 1], got {value!r}")
        for name in self.positive_numbers:
            value = getattr(self, name)
            if not is_number(value) or not 0 < value < math.inf:
                raise self._fail(name, f"must be a positive number, got {value!r}")
        # hidden_size need not split into the heads here: transformers saves and reads such a config back, and only
        # its model refuses it. So does hfbert's (`check_heads`, naming the file the config came from).
        for name in self.activations:
            value = getattr(self, name)
            if not isinstance(value, str) or value not in ACTIVATIONS:
                raise self._fail(name, f"is {value!r}; supported: {', '.join(sorted(ACTIVATIONS))}")
        for name in self.flags:
            if not isinstance(getattr(self, name), bool):
                raise self._fail(name, f"must be true or false, got {getattr(self, name)!r}")
        # Kept as written (1 / 0 / null in older files): transformers' BertModel returns a tuple only for False, its
        # task models for any falsy value (`wants_tuple`, heads.py).
        if self.return_dict not in (True, False, None) or isinstance(self.return_dict, float):
            raise self._fail("return_dict", f"must be true or false, got {self.return_dict!r}")
        if not is_integer(self.chunk_size_feed_forward) or self.chunk_size_feed_forward < 0:
            raise self._fail(
                "chunk_size_feed_forward", f"must be a non-negative integer, got {self.chunk_size_feed_forward!r}"
            )
        if self.dtype is not None:
            self._torch_dtype(self.dtype)
        if self.pad_token_id is not None and (
            not is_integer(self.pad_token_id) or not 0 <= self.pad_token_id < self.vocab_size
        ):
            raise self._fail(
                "pad_token_id", f"must be None or in [0, vocab_size={self.vocab_size}), got {self.pad_token_id!r}"
            )
        if self.problem_type not in PROBLEM_TYPES:
            raise self._fail("problem_type", f"is {self.problem_type!r}; expected one of {PROBLEM_TYPES}")
        if self.problem_type == "single_label_classification" and self.num_labels == 1:  # as transformers refuses it
            raise self._fail("problem_type", "'single_label_classification' needs num_labels > 1 (use 'regression')")
        if self.positions_after_padding:
            if not is_integer(self.position_padding_idx):
                raise self._fail("pad_token_id", f"must be set for {self.model_type!r}: positions count from it")
            if self.max_sequence_length < 1:
                raise self._fail(
                    "max_position_embeddings",
                    f"({self.max_position_embeddings}) must exceed pad_token_id + 1 ({self.position_padding_idx + 1}): "
                    f"{self.model_type!r} positions start after the padding index",
                )

    # -- derived -----------------------------------------------------------------------------------------------
    @classmethod
    def member_layouts(cls) -> dict[str, KeyLayout]:
        """model_type -> how that member's checkpoints name their tensors, for every member (the loader's check
        that tensors and config.json are of one family)."""
        return {model_type: config_class.key_layout for model_type, config_class in cls.members.items()}

    @property
    def is_encoder_decoder(self) -> bool:
        """transformers' flag for encoder-decoder models; every member is an encoder."""
        return False

    def check_heads(self) -> None:
        """Raise ValueError unless hidden_size splits evenly into the attention heads (as transformers' BERT checks
        when a model is built)."""
        if self.hidden_size % self.num_attention_heads != 0:
            raise self._fail(
                "hidden_size",
                f"({self.hidden_size}) must be divisible by num_attention_heads ({self.num_attention_heads})",
            )

    @property
    def positions_after_padding(self) -> bool:
        """Whether positions start after the padding index (RoBERTa's scheme, `positions.PositionsAfterPadding`):
        position ids count from `pad_token_id + 1` for real tokens and are `pad_token_id` at pads; BERT's count from
        0, padding included."""
        return self.positions.after_padding

    @property
    def position_padding_idx(self) -> int | None:
        """The position (and word) embeddings' padding index where positions start after it: `pad_token_id`
        (RoBERTa's family; MPNet overrides it)."""
        return self.pad_token_id

    @property
    def max_sequence_length(self) -> int:
        """The longest input the position table covers (the scheme's `max_length`): `max_position_embeddings`, less
        the padding index + 1 where positions start after it (514 - 2 = 512 for roberta-base and all-mpnet-base-v2)."""
        return self.positions.max_length(self)

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def feed_forward_activation(self) -> str:
        """The name of the feed-forward block's activation, whichever field the member keeps it in (BERT's
        `hidden_act`, ModernBERT's `hidden_activation`)."""
        return self.hidden_act

    def attention_pattern(self) -> str | None:
        """Which layers attend how, in words, for a member whose layers differ (ModernBERT's global and local
        layers); None where every layer attends to every key alike."""
        return None

    def inspect_facts(self) -> dict[str, Any]:
        """What `hfbert inspect` shows of this config: the common facts under their common names, then the member's
        own `inspect_fields`, then its layer pattern where its layers differ (`attention_pattern`)."""
        facts = {name: getattr(self, name) for name in _COMMON_FACTS}
        facts["hidden_act"] = self.feed_forward_activation
        facts |= {name: getattr(self, name) for name in self.inspect_fields}
        pattern = self.attention_pattern()
        if pattern is not None:
            facts["attention"] = pattern
        return facts

    def __getattr__(self, name: str) -> Any:
        # Only reached when `name` is no attribute: a common name of a member's own field (attribute_map), then
        # unknown config.json keys, which read like fields, as they do on transformers' configs.
        mapped = type(self).attribute_map.get(name)
        if mapped is not None:
            return getattr(self, mapped)
        extra = self.__dict__.get("extra_fields", {})
        if name in extra:
            return extra[name]
        raise AttributeError(f"{type(self).__name__} has no field {name!r}")

    # -- dict and JSON -----------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: dict[str, Any], *, source: str | None = None) -> EncoderConfig:
        """Build a config from a parsed config.json; unknown keys go to `extra_fields`.

        `source` (a file name) is quoted in every error message.
        """
        where = f"{source}: " if source else ""
        if not isinstance(values, dict):
            raise ConfigError(f"{where}expected a JSON object, got {type(values).__name__}")
        # A family member's file gets its class, as transformers' AutoConfig gives it (its defaults fill gaps), and
        # that class's fields are the known keys.
        # A file without model_type (some of the oldest BERT checkpoints) is BERT's, as hfbert has always read it.
        model_type = values.get("model_type", "bert" if cls is EncoderConfig else None)
        family_class = cls.members.get(model_type, cls) if isinstance(model_type, str) else cls
        if issubclass(family_class, cls):
            cls = family_class
        elif cls is EncoderConfig:  # an unknown model_type: validate names it
            cls = cls.members["bert"]
        # num_labels is accepted; the runtime attention setting is not read from files.
        known = {f.name for f in dataclasses.fields(cls)} - {"extra_fields", "source", "_attn_implementation"}
        typed = {key: value for key, value in values.items() if key in known}
        for name in _TRUTHY_FLAGS:  # 1 / 0 / null, as older configs write them: read by truthiness, as transformers
            if name in typed and not isinstance(typed[name], bool) and typed[name] in (0, 1, None):
                typed[name] = bool(typed[name])
        extra = {key: value for key, value in values.items() if key not in known}
        # transformers 4.x wrote torch_dtype, 5.x writes dtype. An older file's torch_dtype is read as dtype (as
        # transformers 5 reads it) and kept as an extra field, written back in step with dtype (`to_dict`).
        if typed.get("dtype") is None and extra.get("torch_dtype") is not None:
            typed["dtype"] = extra["torch_dtype"]
        return cls(**typed, extra_fields=extra, source=source)

    @classmethod
    def from_object(cls, config: Any, *, source: str | None = None) -> EncoderConfig:
        """A copy of a config object, hfbert's or transformers' (anything with `to_dict()`), as the model built
        from it would see it. Its `problem_type` is taken as it is set: transformers refuses
        'single_label_classification' with one label when a config is built or loaded, but runs a model whose
        config was given it afterwards (its own test_problem_types does), with that loss."""
        from converters.loading import config_values

        values = config_values(config)
        problem = values.get("problem_type")
        copy = cls.from_dict({**values, "problem_type": None}, source=source)
        if problem not in PROBLEM_TYPES:
            raise copy._fail("problem_type", f"is {problem!r}; expected one of {PROBLEM_TYPES}")
        copy.problem_type = problem
        return copy

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> EncoderConfig:
        """Read a config.json.

        >>> config = BertConfig.from_json_file("bert-base-uncased/config.json")  # doctest: +SKIP
        """
        path = Path(path)
        try:
            values = read_json(path, error=ConfigError)
        except FileNotFoundError:
            raise ConfigError(f"{path}: file not found (a checkpoint needs a config.json)") from None
        except OSError as error:
            raise ConfigError(f"{path}: cannot read: {error}") from None
        return cls.from_dict(values, source=str(path))

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        *,
        revision: str | None = None,
        subfolder: str = "",
        **overrides: Any,
    ) -> EncoderConfig:
        """The config.json of a checkpoint directory or Hub repo id (only that file is downloaded; `subfolder`: the
        folder inside it that holds it), with keyword overrides applied, as transformers' `BertConfig.from_pretrained`
        (PEFT calls it on the base model).

        >>> config = BertConfig.from_pretrained("google-bert/bert-base-uncased", num_labels=3)  # doctest: +SKIP
        """
        from converters.hub import CONFIG_FILE, resolve_checkpoint

        # transformers' loader options are not config fields: never let one (a token!) reach config.json.
        loader_options = sorted(LOADER_OPTIONS & overrides.keys())
        if loader_options:
            raise TypeError(
                f"{cls.__name__}.from_pretrained: {', '.join(loader_options)} not supported (hfbert resolves repo ids "
                "through huggingface_hub's cache and environment; pass revision= for a commit)"
            )
        directory = resolve_checkpoint(
            pretrained_model_name_or_path, revision, include_weights=False, subfolder=subfolder
        )
        config = cls.from_json_file(directory / CONFIG_FILE)
        if not overrides:
            return config
        # A num_labels that differs from the stored labels' count makes new ones (LABEL_0, ...): __post_init__.
        return cls.from_dict({**config.to_dict(), **overrides}, source=config.source)

    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        """Write `save_directory/config.json` (the directory is created), as transformers' configs do."""
        directory = Path(save_directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.to_json_file(directory / "config.json")

    def get_text_config(self, decoder: bool | None = None, encoder: bool | None = None) -> EncoderConfig:
        """transformers asks multimodal configs for their text part; an encoder's config is all text."""
        return self

    def to_dict(self) -> dict[str, Any]:
        """The config.json contents (unknown keys included), as a dict; `dtype` by name, as transformers writes it."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _NOT_IN_JSON}
        if isinstance(values["dtype"], torch.dtype):
            values["dtype"] = str(values["dtype"]).removeprefix("torch.")
        extra = dict(self.extra_fields)
        if extra.get("torch_dtype") is not None and values["dtype"] is not None:
            extra["torch_dtype"] = values["dtype"]  # never a stale dtype for readers of the older name
        return {**extra, **values}

    def to_diff_dict(self) -> dict[str, Any]:
        """The fields whose value differs from the default (and every unknown key), as transformers' configs."""
        defaults = type(self)().to_dict()
        return {key: value for key, value in self.to_dict().items() if key not in defaults or defaults[key] != value}

    def __iter__(self) -> Iterator[str]:
        # transformers' configs iterate over their attribute names (its model tests walk them this way).
        return iter(self.to_dict())

    def to_json_string(self, use_diff: bool = False) -> str:
        """config.json as text. `use_diff` is accepted for transformers' signature; hfbert always writes every
        encoder field (a config read back must not depend on the defaults of the version that reads it). The fields
        of every transformers config are left out at their defaults, as transformers leaves them out."""
        values = {
            key: value
            for key, value in self.to_dict().items()
            if key not in _GENERIC_DEFAULTS or value != _GENERIC_DEFAULTS[key]
        }
        return json.dumps(values, indent=2, sort_keys=True) + "\n"

    def to_json_file(self, path: str | os.PathLike) -> None:
        """Write config.json atomically (temporary file, then rename)."""
        from converters.atomic_write import atomic_file

        with atomic_file(path) as temporary:
            temporary.write_text(self.to_json_string(), encoding="utf-8")


def _torch_dtype_alias(config: EncoderConfig) -> torch.dtype | str | None:
    """transformers' older name of `dtype`."""
    return config.dtype


def _set_torch_dtype_alias(config: EncoderConfig, value: torch.dtype | str | None) -> None:
    config.dtype = value


# Set after the class is made: in its body, the property would be taken for the default of the `torch_dtype` InitVar.
EncoderConfig.torch_dtype = property(_torch_dtype_alias, _set_torch_dtype_alias)


@dataclass
class BertConfig(EncoderConfig):
    """config.json of a BERT checkpoint, with transformers' BertConfig fields and defaults.

    >>> BertConfig(hidden_size=96, num_attention_heads=3, intermediate_size=200).head_size
    32
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    position_embedding_type: str = "absolute"
    use_cache: bool = True
    classifier_dropout: float | None = None
    is_decoder: bool = False
    add_cross_attention: bool = False
    model_type: str = "bert"

    positive_integers: ClassVar[tuple[str, ...]] = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
        "type_vocab_size",
    )
    probabilities: ClassVar[tuple[str, ...]] = (
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
        "classifier_dropout",
    )
    positive_numbers: ClassVar[tuple[str, ...]] = ("initializer_range", "layer_norm_eps")
    activations: ClassVar[tuple[str, ...]] = ("hidden_act",)

    def validate(self) -> None:
        super().validate()
        if self.position_embedding_type != "absolute":
            raise self._fail(
                "position_embedding_type",
                f"is {self.position_embedding_type!r}; hfbert implements only 'absolute' position embeddings",
            )
        for name in ("is_decoder", "add_cross_attention"):
            if getattr(self, name) is not False:
                raise self._fail(name, "must be false: hfbert is an encoder (no causal mask, no cross-attention)")


# The facts every member has, under their common names, that `hfbert inspect` shows first (`inspect_facts`).
_COMMON_FACTS = (
    "model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
    "max_position_embeddings", "max_sequence_length",
)  # fmt: skip
# Far above any real BERT, far below sizes whose parameters overflow torch's size arithmetic (even on the meta
# device) or whose layers and labels take minutes to build: a corrupt config.json fails here, not in torch.
MAX_SIZE = 2**24
MAX_LAYERS = 256
_MAX_LABELS = 2**20
PROBLEM_TYPES = (None, "regression", "single_label_classification", "multi_label_classification")
# Flags transformers' models read from the config by truthiness (`if config.output_attentions`), with no check.
_TRUTHY_FLAGS = ("output_hidden_states", "output_attentions")
# `PretrainedConfig` fields and their defaults, which transformers leaves out of config.json when they have them.
_GENERIC_DEFAULTS = {"return_dict": True, "dtype": None, "chunk_size_feed_forward": 0, "architectures": None}
_NOT_IN_JSON = ("extra_fields", "source", "num_labels", "_attn_implementation")


def is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
