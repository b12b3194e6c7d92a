"""hfbert: a readable PyTorch BERT that loads Hugging Face checkpoints and matches transformers.

>>> import hfbert
>>> model = hfbert.BertModel.from_pretrained("google-bert/bert-base-uncased")  # doctest: +SKIP
"""

from hfbert.config import BertConfig, ConfigError
from hfbert.model import BertModel
from hfbert.outputs import BertModelOutput

__all__ = ["BertConfig", "BertModel", "BertModelOutput", "ConfigError"]
__version__ = "0.1.0"
