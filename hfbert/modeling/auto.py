"""Which hfbert class loads a checkpoint: config.json's `model_type` and the task, as transformers' Auto classes.

>>> model = AutoModel.from_pretrained("FacebookAI/roberta-base")  # doctest: +SKIP
>>> type(model).__name__  # doctest: +SKIP
'RobertaModel'
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, ClassVar

from converters.hub import CONFIG_FILE, resolve_checkpoint
from hfbert.modeling.config import ConfigError, EncoderConfig
from hfbert.modeling.family import MEMBERS
from hfbert.modeling.pretrained import BertPreTrainedModel

# model_type -> task -> class, from the family table. A task a member has no class for (BERT's next-sentence head on
# RoBERTa) is absent.
MODEL_CLASSES: dict[str, dict[str, type[BertPreTrainedModel]]] = {row.model_type: row.classes for row in MEMBERS}


def model_class(config: EncoderConfig, task: str = "model") -> type[BertPreTrainedModel]:
    """The class that builds `config`'s model for `task`; ConfigError naming the config's file and model_type when
    the family has none."""
    classes = MODEL_CLASSES[config.model_type]  # model_type was validated with the config
    if task not in classes:
        where = f"{config.source}: " if config.source else ""
        raise ConfigError(f"{where}model_type {config.model_type!r} has no {task} model (it has: {', '.join(classes)})")
    return classes[task]


def absent_heads(cls: type[BertPreTrainedModel], new_head: Iterable[str]) -> tuple[str, ...]:
    """The prefixes of `cls.heads` (its task's head, as the family's class names it: BERT's `cls.predictions.`,
    RoBERTa's `lm_head.`, ModernBERT's `head.` and `decoder.`) that a checkpoint has no tensor of, from the load
    report's `new_head` (the parameters initialised because their head is absent). Empty when the head loaded.

    >>> from hfbert.modeling.modernbert import ModernBertForMaskedLM
    >>> absent_heads(ModernBertForMaskedLM, ["decoder.bias"])
    ('decoder.',)
    """
    initialised = list(new_head)
    return tuple(prefix for prefix in cls.heads if any(name.startswith(prefix) for name in initialised))


class AutoConfig:
    """transformers' AutoConfig: a config.json read into the config class of the member its `model_type` names.

    >>> AutoConfig.for_model("mpnet", num_hidden_layers=2).num_hidden_layers
    2
    """

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs: Any) -> EncoderConfig:
        """The config.json of a checkpoint directory or Hub repo id, in its member's class (`EncoderConfig`)."""
        return EncoderConfig.from_pretrained(pretrained_model_name_or_path, **kwargs)

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, source: str | None = None) -> EncoderConfig:
        """A parsed config.json in its member's class."""
        return EncoderConfig.from_dict(values, source=source)

    @classmethod
    def for_model(cls, model_type: str, **fields: Any) -> EncoderConfig:
        """A new config of the member `model_type` names, with `fields` set."""
        if model_type not in EncoderConfig.members:
            raise ConfigError(f"model_type {model_type!r}: hfbert loads {', '.join(map(repr, EncoderConfig.members))}")
        return EncoderConfig.members[model_type](**fields)


class AutoModel:
    """`from_pretrained` reads config.json and loads the checkpoint into its family's class for `task`."""

    task: ClassVar[str] = "model"

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *model_args: Any, **kwargs: Any) -> Any:
        """The family's class for `task`, chosen by config.json's model_type (or `config=`), then its
        `from_pretrained` with the same arguments (`subfolder` too)."""
        config = kwargs.get("config")
        if config is None:
            directory = resolve_checkpoint(
                pretrained_model_name_or_path,
                kwargs.get("revision"),
                include_weights=False,
                subfolder=kwargs.get("subfolder", ""),
            )
            # Read once: the class's loader takes it as `config=` and keeps its source for its messages.
            kwargs["config"] = config = EncoderConfig.from_json_file(directory / CONFIG_FILE)
        elif not isinstance(config, EncoderConfig):
            config = EncoderConfig.from_object(config)
        return model_class(config, cls.task).from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)

    @classmethod
    def from_config(cls, config: EncoderConfig, **kwargs: Any) -> BertPreTrainedModel:
        """A randomly initialised model of `config`'s family."""
        return model_class(config, cls.task)(config, **kwargs)


class AutoModelForMaskedLM(AutoModel):
    task = "masked-lm"


class AutoModelForSequenceClassification(AutoModel):
    task = "sequence-classification"


class AutoModelForTokenClassification(AutoModel):
    task = "token-classification"


class AutoModelForQuestionAnswering(AutoModel):
    task = "question-answering"


class AutoModelForMultipleChoice(AutoModel):
    task = "multiple-choice"
