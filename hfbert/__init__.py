"""hfbert: a readable PyTorch BERT that loads Hugging Face checkpoints and matches transformers.

>>> import hfbert
>>> model = hfbert.BertModel.from_pretrained("google-bert/bert-base-uncased")  # doctest: +SKIP
"""

from hfbert.platform import threads as _threads  # noqa: F401  # isort: skip  first: OpenMP waits, before torch loads
from converters.errors import CheckpointError, CheckpointNotFoundError
from hfbert.inference import optimize_for_inference, restore_weights
from hfbert.modeling.auto import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)
from hfbert.modeling.config import BertConfig, ConfigError, EncoderConfig
from hfbert.modeling.deberta_v2 import (
    DebertaV2Config,
    DebertaV2ForMaskedLM,
    DebertaV2ForMultipleChoice,
    DebertaV2ForQuestionAnswering,
    DebertaV2ForSequenceClassification,
    DebertaV2ForTokenClassification,
    DebertaV2Model,
)
from hfbert.modeling.distilbert import (
    DistilBertConfig,
    DistilBertForMaskedLM,
    DistilBertForMultipleChoice,
    DistilBertForQuestionAnswering,
    DistilBertForSequenceClassification,
    DistilBertForTokenClassification,
    DistilBertModel,
)
from hfbert.modeling.electra import (
    ElectraConfig,
    ElectraForMaskedLM,
    ElectraForMultipleChoice,
    ElectraForPreTraining,
    ElectraForQuestionAnswering,
    ElectraForSequenceClassification,
    ElectraForTokenClassification,
    ElectraModel,
)
from hfbert.modeling.heads import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForNextSentencePrediction,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from hfbert.modeling.model import BertModel
from hfbert.modeling.modernbert import (
    ModernBertConfig,
    ModernBertForMaskedLM,
    ModernBertForMultipleChoice,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
    ModernBertModel,
)
from hfbert.modeling.mpnet import (
    MPNetConfig,
    MPNetForMaskedLM,
    MPNetForMultipleChoice,
    MPNetForQuestionAnswering,
    MPNetForSequenceClassification,
    MPNetForTokenClassification,
    MPNetModel,
)
from hfbert.modeling.outputs import BertModelOutput
from hfbert.modeling.pretrained import BertPreTrainedModel
from hfbert.modeling.roberta import (
    CamembertConfig,
    CamembertForMaskedLM,
    CamembertForMultipleChoice,
    CamembertForQuestionAnswering,
    CamembertForSequenceClassification,
    CamembertForTokenClassification,
    CamembertModel,
    RobertaConfig,
    RobertaForMaskedLM,
    RobertaForMultipleChoice,
    RobertaForQuestionAnswering,
    RobertaForSequenceClassification,
    RobertaForTokenClassification,
    RobertaModel,
    XLMRobertaConfig,
    XLMRobertaForMaskedLM,
    XLMRobertaForMultipleChoice,
    XLMRobertaForQuestionAnswering,
    XLMRobertaForSequenceClassification,
    XLMRobertaForTokenClassification,
    XLMRobertaModel,
)
from hfbert.platform.mkl import use_fast_branch

# Before anything computes: MKL's fast branch on AMD CPUs, chosen at MKL's first product (platform/mkl.py).
use_fast_branch()

__all__ = [
    "AutoModel",
    "AutoModelForMaskedLM",
    "AutoModelForMultipleChoice",
    "AutoModelForQuestionAnswering",
    "AutoModelForSequenceClassification",
    "AutoModelForTokenClassification",
    "AutoTokenizer",
    "BatchEncoding",
    "AutoConfig",
    "BertConfig",
    "EncoderConfig",
    "BertForMaskedLM",
    "BertForMultipleChoice",
    "BertForNextSentencePrediction",
    "BertForPreTraining",
    "BertForQuestionAnswering",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertModel",
    "BertModelOutput",
    "BertPreTrainedModel",
    "BertTokenizer",
    "CamembertConfig",
    "CamembertForMaskedLM",
    "CamembertForMultipleChoice",
    "CamembertForQuestionAnswering",
    "CamembertForSequenceClassification",
    "CamembertForTokenClassification",
    "CamembertModel",
    "CheckpointError",
    "CheckpointNotFoundError",
    "ConfigError",
    "CrossEncoder",
    "DebertaV2Config",
    "DebertaV2ForMaskedLM",
    "DebertaV2ForMultipleChoice",
    "DebertaV2ForQuestionAnswering",
    "DebertaV2ForSequenceClassification",
    "DebertaV2ForTokenClassification",
    "DebertaV2Model",
    "DistilBertConfig",
    "DistilBertForMaskedLM",
    "DistilBertForMultipleChoice",
    "DistilBertForQuestionAnswering",
    "DistilBertForSequenceClassification",
    "DistilBertForTokenClassification",
    "DistilBertModel",
    "DistilBertTokenizer",
    "ElectraConfig",
    "ElectraForMaskedLM",
    "ElectraForMultipleChoice",
    "ElectraForPreTraining",
    "ElectraForQuestionAnswering",
    "ElectraForSequenceClassification",
    "ElectraForTokenClassification",
    "ElectraModel",
    "Embedder",
    "MPNetConfig",
    "ModernBertConfig",
    "ModernBertForMaskedLM",
    "ModernBertForMultipleChoice",
    "ModernBertForQuestionAnswering",
    "ModernBertForSequenceClassification",
    "ModernBertForTokenClassification",
    "ModernBertModel",
    "ModernBertTokenizer",
    "MPNetForMaskedLM",
    "MPNetForMultipleChoice",
    "MPNetForQuestionAnswering",
    "MPNetForSequenceClassification",
    "MPNetForTokenClassification",
    "MPNetModel",
    "MPNetTokenizer",
    "RobertaConfig",
    "RobertaForMaskedLM",
    "RobertaForMultipleChoice",
    "RobertaForQuestionAnswering",
    "RobertaForSequenceClassification",
    "RobertaForTokenClassification",
    "RobertaModel",
    "RobertaTokenizer",
    "SparseEncoder",
    "XLMRobertaConfig",
    "XLMRobertaForMaskedLM",
    "XLMRobertaForMultipleChoice",
    "XLMRobertaForQuestionAnswering",
    "XLMRobertaForSequenceClassification",
    "XLMRobertaForTokenClassification",
    "XLMRobertaModel",
    "XLMRobertaTokenizer",
    "optimize_for_inference",
    "restore_weights",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    # The tokenizer pulls in the `tokenizers` library; load it on first use so `import hfbert` stays light.
    tokenizers = (
        "AutoTokenizer",
        "BertTokenizer",
        "DistilBertTokenizer",
        "MPNetTokenizer",
        "ModernBertTokenizer",
        "RobertaTokenizer",
        "XLMRobertaTokenizer",
    )
    if name in (*tokenizers, "BatchEncoding"):
        from hfbert.modeling import tokenizer

        return getattr(tokenizer, name)
    # The retrieval encoders (embeddings, reranking, sparse vectors) are tools, loaded on first use like the tokenizer.
    if name == "Embedder":
        from hfbert.tools.embedding import Embedder

        return Embedder
    if name == "CrossEncoder":
        from hfbert.tools.reranking import CrossEncoder

        return CrossEncoder
    if name == "SparseEncoder":
        from hfbert.tools.sparse import SparseEncoder

        return SparseEncoder
    raise AttributeError(f"module 'hfbert' has no attribute {name!r}")
