"""Reranking and SPLADE folders for tests/test_rerank.py and tests/test_sparse.py (issue #52), written by the
references' own classes: a transformers `...ForSequenceClassification` saved as sentence-transformers' CrossEncoder
saves it (or as its older releases did), and a transformers `...ForMaskedLM` saved by sentence-transformers'
SparseEncoder with MLMTransformer + SpladePooling. Weights are random and far from transformers' init
(`support.helpers.randomize_weights`), the classifier's scaled up so that scores spread over several units; the
tokenizers have a few hundred pieces (trained on `support.family.TEXTS`), so a text is many ids."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from tokenizers import BertWordPieceTokenizer

from support.family import PREFIXES, TEXTS, tokenizer_of
from support.helpers import randomize_weights

PREFIXES = {**PREFIXES, "bert": "Bert", "mpnet": "MPNet"}
# Small configs: 2 layers of width 32; BERT's 64 positions, RoBERTa's 514 (512 tokens, as the real ones).
CONFIG = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
POSITIONS = {"bert": 64, "mpnet": 64, "roberta": 514, "xlm-roberta": 514, "camembert": 514}
DOCUMENTS = [
    *TEXTS,
    "",
    "Yes.",
    " ".join(TEXTS[:3]),
    " ".join(TEXTS),  # longer than a 64-token model: truncated
    TEXTS[1].upper(),
]
QUERIES = ["what is the capital of France?", "protein", TEXTS[4]]


def wordpiece_tokenizer(member: str = "bert", model_max_length: int = 64) -> transformers.PreTrainedTokenizerFast:
    """An uncased WordPiece tokenizer of about 220 pieces: BERT's specials and framing, or MPNet's (<s> ... </s>)."""
    specials = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"] if member == "mpnet" else None
    trained = BertWordPieceTokenizer(lowercase=True)
    specials = specials or ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trained.train_from_iterator(TEXTS * 3, vocab_size=300, min_frequency=1, special_tokens=specials)
    fast_class = transformers.MPNetTokenizerFast if member == "mpnet" else transformers.BertTokenizerFast
    return fast_class(tokenizer_object=trained._tokenizer, model_max_length=model_max_length)


def tokenizer_for(member: str, model_max_length: int) -> transformers.PreTrainedTokenizerFast:
    if member in ("bert", "mpnet"):
        return wordpiece_tokenizer(member, model_max_length)
    return tokenizer_of(member, model_max_length)


def transformers_checkpoint(directory: Path, member: str, task: str, seed: int = 0, **fields) -> Path:
    """transformers' `<Prefix><task>` of `member` with random weights and its small tokenizer, saved by
    `save_pretrained` into `directory`. `model_max_length` (default: the model's longest input) goes to the
    tokenizer, the rest to the config."""
    positions = POSITIONS[member]
    longest = positions if member == "bert" else positions - 2  # RoBERTa's and MPNet's positions start at 2
    tokenizer = tokenizer_for(member, fields.pop("model_max_length", longest))
    tokenizer.save_pretrained(directory)
    values = {**CONFIG, "vocab_size": len(tokenizer), "max_position_embeddings": positions}
    if member == "bert":
        values["type_vocab_size"] = 2
    else:
        values.update(pad_token_id=1, bos_token_id=0, eos_token_id=2)
        values.update({"type_vocab_size": 1} if member != "mpnet" else {})
    config = getattr(transformers, f"{PREFIXES[member]}Config")(**{**values, **fields})
    torch.manual_seed(seed)
    model = randomize_weights(getattr(transformers, f"{PREFIXES[member]}{task}")(config)).eval()
    with torch.no_grad():
        if task == "ForSequenceClassification":  # scores spread over units, not hundredths
            last = model.classifier if member == "bert" else model.classifier.out_proj
            last.weight.mul_(5.0)
            last.bias.zero_()
        if task == "ForMaskedLM":  # most words absent from a text's vector, as in a trained SPLADE model
            head = model.cls.predictions if member == "bert" else model.lm_head
            head.bias.sub_(1.0)
    model.save_pretrained(directory)
    return directory


def cross_encoder_folder(
    directory: Path, member: str = "bert", num_labels: int = 1, layout: str = "6.x", activation=None, **fields
) -> Path:
    """A cross-encoder folder of `member` as sentence-transformers writes it. `layout`: "6.x" (CrossEncoder.save:
    modules.json, the activation in config_sentence_transformers.json), "5.x" (no modules.json, config.json's
    `sentence_transformers.activation_fn`, as 4.x and 5.x saved), "legacy" (config.json's
    `sbert_ce_default_activation_function`, before 4.0: cross-encoder/ms-marco-MiniLM-L6-v2 says Identity) or
    "plain" (a transformers checkpoint and nothing else). `activation`: the torch.nn module given to the
    CrossEncoder ("6.x") or the dotted path written ("5.x", "legacy"); None keeps sentence-transformers' default."""
    from sentence_transformers import CrossEncoder

    raw = directory.with_name(directory.name + "-transformers")
    transformers_checkpoint(raw, member, "ForSequenceClassification", num_labels=num_labels, **fields)
    if layout == "6.x":
        CrossEncoder(str(raw), activation_fn=activation, device="cpu").save(str(directory))
        return directory
    raw.rename(directory)
    if layout in ("5.x", "legacy") and activation is not None:
        config = json.loads((directory / "config.json").read_text())
        if layout == "5.x":
            config["sentence_transformers"] = {"activation_fn": activation, "version": "5.0.0"}
        else:
            config["sbert_ce_default_activation_function"] = activation
        (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def splade_folder(
    directory: Path, member: str = "bert", pooling: str = "max", layout: str = "6.x", **pooling_options
) -> Path:
    """A SPLADE folder of `member` (a transformers `...ForMaskedLM`) saved by sentence-transformers' SparseEncoder
    with MLMTransformer + SpladePooling(`pooling`). `layout`: "6.x" as saved, "transformer" (6.x's Transformer
    module of task fill-mask instead of MLMTransformer), "5.x" (the module types as 5.x wrote them,
    `sentence_transformers.sparse_encoder.models.*`, with max_seq_length in sentence_bert_config.json and the
    pooling config's `word_embedding_dimension`: naver/splade-v3's files)."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    raw = directory.with_name(directory.name + "-transformers")
    transformers_checkpoint(raw, member, "ForMaskedLM")
    if layout == "transformer":
        transformer = Transformer(str(raw), transformer_task="fill-mask")
    else:
        transformer = MLMTransformer(str(raw))
    model = SparseEncoder(modules=[transformer, SpladePooling(pooling, **pooling_options)], device="cpu")
    model.save_pretrained(str(directory))
    if layout == "5.x":
        modules = json.loads((directory / "modules.json").read_text())
        for module in modules:
            module["type"] = "sentence_transformers.sparse_encoder.models." + module["type"].rsplit(".", 1)[1]
        (directory / "modules.json").write_text(json.dumps(modules, indent=2))
        length = json.loads((raw / "tokenizer_config.json").read_text())["model_max_length"]
        (directory / "sentence_bert_config.json").write_text(
            json.dumps({"max_seq_length": length, "do_lower_case": False})
        )
        pooling_file = directory / modules[1]["path"] / "config.json"
        config = json.loads(pooling_file.read_text())
        config.pop("embedding_dimension", None)
        config["word_embedding_dimension"] = model[0].model.config.vocab_size
        pooling_file.write_text(json.dumps(config, indent=2))
    return directory
