"""The family: one record per member (`Member`), and the table of them (`MEMBERS`). Every registry is read from it.

A member is what config.json's `model_type` names: its config class, its classes by task, its tokenizer (and whether
model_type decides it over tokenizer_config.json's class), whether it has token types, the modules of its masked-LM
head and decoder, whether transformers' model of it is exact in float64, and the names transformers gives the same
things (its class names, and where its layers keep their self-attention, for `hfbert parity`'s per-layer maps).
Tools read these here and probe no model. Two facts ride on the config class, because the floors under this table
need them when they read a config.json or a checkpoint: how the member counts positions (`positions`,
`positions.py`) and how its checkpoints name their tensors (`key_layout`, `converters.key_map`); two on its model
classes, whose code reads them: where the layer list sits (`layers`) and the tensor prefixes of the masked-LM head
(`masked_lm_heads`). Its special tokens are its tokenizer class's.

`hfbert.AutoModel*`, `AutoTokenizer`, `BertConfig.from_dict` (through the config classes), the checkpoint loader's
family check, `hfbert parity`, `embed`, `convert` and `inspect` all find a member here. Adding one is a row below and
its model file (docs/architecture.md, "Adding a member").

    >>> member("xlm-roberta").classes["masked-lm"].__name__
    'XLMRobertaForMaskedLM'
    >>> member("mpnet").reference_class("masked-lm")
    'MPNetForMaskedLM'
"""

from __future__ import annotations

from dataclasses import dataclass

from converters.key_map import KeyLayout
from hfbert.modeling import deberta_v2, distilbert, electra, heads, modernbert, mpnet, roberta
from hfbert.modeling.config import BertConfig, ConfigError
from hfbert.modeling.model import BertModel
from hfbert.modeling.positions import PositionScheme
from hfbert.modeling.pretrained import BertPreTrainedModel

# transformers' class-name suffix of each task, in the order a member's classes are listed.
TASK_SUFFIXES = {
    "model": "Model",
    "pretraining": "ForPreTraining",
    "masked-lm": "ForMaskedLM",
    "next-sentence": "ForNextSentencePrediction",
    "sequence-classification": "ForSequenceClassification",
    "token-classification": "ForTokenClassification",
    "question-answering": "ForQuestionAnswering",
    "multiple-choice": "ForMultipleChoice",
}
# transformers' tokenizers that build BERT's pipeline (BasicTokenizer + WordPiece, [CLS] / [SEP]) from a vocab.txt.
WORDPIECE_TOKENIZERS = (
    "BertTokenizer",
    "DistilBertTokenizer",
    "ElectraTokenizer",
    "MobileBertTokenizer",
    "SqueezeBertTokenizer",
    "LayoutLMTokenizer",
    "ConvBertTokenizer",
    "LxmertTokenizer",
    "RetriBertTokenizer",
)


@dataclass(frozen=True)
class Member:
    """One member of the family, as config.json's `model_type` names it."""

    model_type: str
    config_class: type[BertConfig]
    classes: dict[str, type[BertPreTrainedModel]]  # task ("model", "masked-lm", ...) -> hfbert class
    tokenizer: str  # hfbert's tokenizer class, by name (hfbert.modeling.tokenizer loads the tokenizers library)
    tokenizer_names: tuple[str, ...]  # transformers' `tokenizer_class` values that mean this tokenizer ("Fast" dropped)
    token_types: bool  # whether the embeddings have `token_type_embeddings` (MPNet's have none)
    reference: str  # transformers' class-name prefix ("XLMRoberta": XLMRobertaModel, XLMRobertaConfig, ...)
    reference_attention: str  # where transformers' layer keeps its self-attention (parity's per-layer maps)
    # The modules of the masked LM, applied in turn, that turn the last hidden state into vocabulary logits, by the
    # same names in both libraries (BERT's `cls.predictions`; ModernBERT's `head`, then `decoder`).
    masked_lm_modules: tuple[str, ...]
    decoder: str  # the masked LM's vocabulary projection (its output embeddings), by module name in both libraries
    # Whether config.json's model_type decides the tokenizer over tokenizer_config.json's `tokenizer_class`, as
    # transformers 5 does for the members whose Hub files name the wrong class (its
    # MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS: ModernBERT's say "PreTrainedTokenizerFast").
    tokenizer_over_class: bool = False
    # Whether transformers' model of this member, cast to float64, computes in float64 throughout with its eager
    # kernel (parity's exact reference as it is). ModernBERT's takes the softmax and its rotary angles in float32.
    reference_float64_exact: bool = True

    @property
    def layers(self) -> str:
        """Where the encoder keeps its layer list, by module name in both libraries ("encoder.layer", "layers"); the
        model class states it, since its forward reads it (`EncoderModel.layers_path`)."""
        return self.classes["model"].layers_path

    @property
    def masked_lm_heads(self) -> tuple[str, ...]:
        """The tensor-name prefixes of the masked LM's head (BERT's `cls.predictions.`, RoBERTa's `lm_head.`,
        ModernBERT's `head.` and `decoder.`); the masked-LM class states them, since the loader reads them there
        (`heads`). A checkpoint without a tensor under one of them has no masked-LM head (`auto.absent_heads`)."""
        return self.classes["masked-lm"].heads

    @property
    def positions(self) -> PositionScheme:
        """How the member counts positions (`positions.py`)."""
        return self.config_class.positions

    @property
    def key_layout(self) -> KeyLayout:
        """How its checkpoints name their tensors: the encoder's prefix in task models, the heads."""
        return self.config_class.key_layout

    def reference_class(self, task: str = "model") -> str:
        """transformers' name of this member's class for `task`."""
        return self.reference + TASK_SUFFIXES[task]


MEMBERS: tuple[Member, ...] = (
    Member(
        model_type="bert",
        config_class=BertConfig,
        classes={
            "model": BertModel,
            "pretraining": heads.BertForPreTraining,
            "masked-lm": heads.BertForMaskedLM,
            "next-sentence": heads.BertForNextSentencePrediction,
            "sequence-classification": heads.BertForSequenceClassification,
            "token-classification": heads.BertForTokenClassification,
            "question-answering": heads.BertForQuestionAnswering,
            "multiple-choice": heads.BertForMultipleChoice,
        },
        tokenizer="BertTokenizer",
        # The WordPiece tokenizers of no other row (ELECTRA's and DistilBERT's rows own their names).
        tokenizer_names=tuple(
            name for name in WORDPIECE_TOKENIZERS if name not in ("ElectraTokenizer", "DistilBertTokenizer")
        ),
        token_types=True,
        reference="Bert",
        reference_attention="attention.self",
        masked_lm_modules=("cls.predictions",),
        decoder="cls.predictions.decoder",
    ),
    Member(
        model_type="roberta",
        config_class=roberta.RobertaConfig,
        classes={
            "model": roberta.RobertaModel,
            "masked-lm": roberta.RobertaForMaskedLM,
            "sequence-classification": roberta.RobertaForSequenceClassification,
            "token-classification": roberta.RobertaForTokenClassification,
            "question-answering": roberta.RobertaForQuestionAnswering,
            "multiple-choice": roberta.RobertaForMultipleChoice,
        },
        tokenizer="RobertaTokenizer",
        tokenizer_names=("RobertaTokenizer",),
        token_types=True,
        reference="Roberta",
        reference_attention="attention.self",
        masked_lm_modules=("lm_head",),
        decoder="lm_head.decoder",
    ),
    Member(
        model_type="xlm-roberta",
        config_class=roberta.XLMRobertaConfig,
        classes={
            "model": roberta.XLMRobertaModel,
            "masked-lm": roberta.XLMRobertaForMaskedLM,
            "sequence-classification": roberta.XLMRobertaForSequenceClassification,
            "token-classification": roberta.XLMRobertaForTokenClassification,
            "question-answering": roberta.XLMRobertaForQuestionAnswering,
            "multiple-choice": roberta.XLMRobertaForMultipleChoice,
        },
        tokenizer="XLMRobertaTokenizer",
        tokenizer_names=("XLMRobertaTokenizer",),
        token_types=True,
        reference="XLMRoberta",
        reference_attention="attention.self",
        masked_lm_modules=("lm_head",),
        decoder="lm_head.decoder",
    ),
    Member(
        model_type="camembert",
        config_class=roberta.CamembertConfig,
        classes={
            "model": roberta.CamembertModel,
            "masked-lm": roberta.CamembertForMaskedLM,
            "sequence-classification": roberta.CamembertForSequenceClassification,
            "token-classification": roberta.CamembertForTokenClassification,
            "question-answering": roberta.CamembertForQuestionAnswering,
            "multiple-choice": roberta.CamembertForMultipleChoice,
        },
        tokenizer="XLMRobertaTokenizer",  # CamemBERT's SentencePiece files are XLM-R's layout
        tokenizer_names=("CamembertTokenizer",),
        token_types=True,
        reference="Camembert",
        reference_attention="attention.self",
        masked_lm_modules=("lm_head",),
        decoder="lm_head.decoder",
    ),
    Member(
        model_type="mpnet",
        config_class=mpnet.MPNetConfig,
        classes={
            "model": mpnet.MPNetModel,
            "masked-lm": mpnet.MPNetForMaskedLM,
            "sequence-classification": mpnet.MPNetForSequenceClassification,
            "token-classification": mpnet.MPNetForTokenClassification,
            "question-answering": mpnet.MPNetForQuestionAnswering,
            "multiple-choice": mpnet.MPNetForMultipleChoice,
        },
        tokenizer="MPNetTokenizer",
        tokenizer_names=("MPNetTokenizer",),
        token_types=False,
        reference="MPNet",
        reference_attention="attention.attn",
        masked_lm_modules=("lm_head",),
        decoder="lm_head.decoder",
    ),
    Member(
        model_type="modernbert",
        config_class=modernbert.ModernBertConfig,
        classes={
            "model": modernbert.ModernBertModel,
            "masked-lm": modernbert.ModernBertForMaskedLM,
            "sequence-classification": modernbert.ModernBertForSequenceClassification,
            "token-classification": modernbert.ModernBertForTokenClassification,
            "question-answering": modernbert.ModernBertForQuestionAnswering,
            "multiple-choice": modernbert.ModernBertForMultipleChoice,
        },
        tokenizer="ModernBertTokenizer",
        tokenizer_names=("ModernBertTokenizer",),
        token_types=False,
        reference="ModernBert",
        reference_attention="attn",
        masked_lm_modules=("head", "decoder"),
        decoder="decoder",
        tokenizer_over_class=True,
        reference_float64_exact=False,
    ),
    Member(
        model_type="electra",
        config_class=electra.ElectraConfig,
        classes={
            "model": electra.ElectraModel,
            "pretraining": electra.ElectraForPreTraining,
            "masked-lm": electra.ElectraForMaskedLM,
            "sequence-classification": electra.ElectraForSequenceClassification,
            "token-classification": electra.ElectraForTokenClassification,
            "question-answering": electra.ElectraForQuestionAnswering,
            "multiple-choice": electra.ElectraForMultipleChoice,
        },
        tokenizer="BertTokenizer",  # BERT's WordPiece pipeline from vocab.txt
        tokenizer_names=("ElectraTokenizer",),
        token_types=True,
        reference="Electra",
        reference_attention="attention.self",
        masked_lm_modules=("generator_predictions", "generator_lm_head"),
        decoder="generator_lm_head",
    ),
    Member(
        model_type="distilbert",
        config_class=distilbert.DistilBertConfig,
        classes={
            "model": distilbert.DistilBertModel,
            "masked-lm": distilbert.DistilBertForMaskedLM,
            "sequence-classification": distilbert.DistilBertForSequenceClassification,
            "token-classification": distilbert.DistilBertForTokenClassification,
            "question-answering": distilbert.DistilBertForQuestionAnswering,
            "multiple-choice": distilbert.DistilBertForMultipleChoice,
        },
        tokenizer="DistilBertTokenizer",  # BERT's WordPiece, without token types
        tokenizer_names=("DistilBertTokenizer",),
        token_types=False,
        reference="DistilBert",
        reference_attention="attention",
        masked_lm_modules=("vocab_transform", "activation", "vocab_layer_norm", "vocab_projector"),
        decoder="vocab_projector",
    ),
    Member(
        model_type="deberta-v2",
        config_class=deberta_v2.DebertaV2Config,
        classes={
            "model": deberta_v2.DebertaV2Model,
            "masked-lm": deberta_v2.DebertaV2ForMaskedLM,
            "sequence-classification": deberta_v2.DebertaV2ForSequenceClassification,
            "token-classification": deberta_v2.DebertaV2ForTokenClassification,
            "question-answering": deberta_v2.DebertaV2ForQuestionAnswering,
            "multiple-choice": deberta_v2.DebertaV2ForMultipleChoice,
        },
        tokenizer="DebertaV2Tokenizer",
        tokenizer_names=("DebertaV2Tokenizer",),
        token_types=False,  # type_vocab_size 0 in every published checkpoint: its tokenizer's segment ids are ignored
        reference="DebertaV2",
        reference_attention="attention.self",
        masked_lm_modules=("cls.predictions",),  # transformers' default (`legacy`) head
        decoder="cls.predictions.decoder",
        # Exact in float64, but its encoder reads `rel_embeddings.weight` directly, which parity's float64 twin does
        # not cast (it casts what embeddings look up): parity's adapter casts it.
        reference_float64_exact=False,
    ),
)

BY_MODEL_TYPE: dict[str, Member] = {row.model_type: row for row in MEMBERS}


def member(model_type: str) -> Member:
    """The member config.json's `model_type` names; ConfigError listing the known ones otherwise."""
    if model_type not in BY_MODEL_TYPE:
        raise ConfigError(f"model_type {model_type!r}: hfbert loads {', '.join(map(repr, BY_MODEL_TYPE))}")
    return BY_MODEL_TYPE[model_type]
