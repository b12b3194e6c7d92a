"""transformers' data collators and Trainer with hfbert's tokenizers (issue #64, "a new user's first hour" 2): the
usual Trainer recipe, `DataCollatorWithPadding(tokenizer)`, failed with `no attribute 'pad'`.

For every member's tokenizer (`support.members.TOKENIZERS`, loaded by `hfbert.AutoTokenizer` and by transformers'
`AutoTokenizer` from the same folder), each collator transformers has for encoder models gives, on the same features,
element-wise the same batch (keys, order, dtypes, values) with hfbert's tokenizer as with transformers' own: padding
right and left, with and without `pad_to_multiple_of`, to torch tensors and numpy arrays; the masked-LM collator
with a fixed seed, so that its random masking is comparable. `pad` itself is compared on the inputs collators and
users give it, and one short Trainer run takes hfbert's tokenizer as its `processing_class` and saves it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import hfbert

from support.family import TEXTS
from support.members import MODEL_TYPES, tokenized_checkpoint, with_tokenizer

transformers = pytest.importorskip("transformers")

SIDES = ("right", "left")
MULTIPLES = (None, 8)


@pytest.fixture(scope="module")
def tokenizer_folders(tmp_path_factory, request):
    """model_type -> a folder with the member's tokenizer files (as its checkpoints ship them) and a config.json
    naming the model type, written on first use."""
    folders = {}

    def folder(model_type: str) -> Path:
        if model_type not in folders:
            directory = with_tokenizer(tmp_path_factory.mktemp(f"{model_type}-tokenizer"), model_type, request)
            (directory / "config.json").write_text(json.dumps({"model_type": model_type}))
            folders[model_type] = directory
        return folders[model_type]

    return folder


def both_tokenizers(folder: Path, padding_side: str):
    """hfbert's and transformers' tokenizer of `folder`, both padding on `padding_side`."""
    ours = hfbert.AutoTokenizer.from_pretrained(folder)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    ours.padding_side = theirs.padding_side = padding_side
    return ours, theirs


def assert_same_batch(ours, theirs, what: str = "") -> None:
    """The same keys in the same order, and each value of the same type, dtype and values."""
    assert list(ours) == list(theirs), what
    for key in theirs:
        mine, reference = ours[key], theirs[key]
        assert type(mine) is type(reference), f"{what} {key}: {type(mine).__name__} != {type(reference).__name__}"
        if isinstance(reference, torch.Tensor):
            assert mine.dtype == reference.dtype and mine.shape == reference.shape, f"{what} {key}"
            assert torch.equal(mine, reference), f"{what} {key}:\n{mine}\n{reference}"
        elif isinstance(reference, np.ndarray):
            assert mine.dtype == reference.dtype and mine.shape == reference.shape, f"{what} {key}"
            assert np.array_equal(mine, reference), f"{what} {key}:\n{mine}\n{reference}"
        else:
            assert mine == reference, f"{what} {key}"


def features(tokenizer, **options) -> list[dict]:
    """TEXTS encoded one by one (rows of unequal lengths, at most 30 tokens), as a dataset's `map(tokenizer)`
    leaves them."""
    options = {"truncation": True, "max_length": 30, **options}
    return [{key: list(value) for key, value in tokenizer(text, **options).items()} for text in TEXTS]


@pytest.mark.parametrize("padding_side", SIDES)
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_collators_give_transformers_batches(model_type, padding_side, tokenizer_folders):
    ours, theirs = both_tokenizers(tokenizer_folders(model_type), padding_side)
    rows = features(theirs, return_special_tokens_mask=True)
    # The masked-LM recipe (run_mlm.py) asks the tokenizer for the special tokens' mask: hfbert's gives the same.
    assert features(ours, return_special_tokens_mask=True) == rows
    assert len(ours) == len(theirs) and ours.all_special_ids == theirs.all_special_ids
    plain = [{key: value for key, value in row.items() if key != "special_tokens_mask"} for row in rows]
    labelled = [{**row, "label": index % 3} for index, row in enumerate(plain)]
    tagged = [{**row, "labels": [index % 5 for index in range(len(row["input_ids"]))]} for row in plain]
    # Four questions of three choices each, the choices rows of unequal lengths.
    choices = [
        {
            **{key: [plain[(index + choice) % len(plain)][key] for choice in range(3)] for key in plain[0]},
            "label": index % 3,
        }
        for index in range(4)
    ]
    for multiple in MULTIPLES:
        cases = {
            "with-padding": (transformers.DataCollatorWithPadding, {}, labelled),
            "with-padding-np": (transformers.DataCollatorWithPadding, {"return_tensors": "np"}, labelled),
            "with-padding-max-length": (
                transformers.DataCollatorWithPadding,
                {"padding": "max_length", "max_length": 36},
                labelled,
            ),
            "token-classification": (transformers.DataCollatorForTokenClassification, {}, tagged),
            "multiple-choice": (transformers.DataCollatorForMultipleChoice, {}, choices),
            "token-classification-np": (
                transformers.DataCollatorForTokenClassification,
                {"return_tensors": "np"},
                tagged,
            ),
            # Without special_tokens_mask the collator asks get_special_tokens_mask(ids, already_has_special_tokens).
            "language-modeling": (transformers.DataCollatorForLanguageModeling, {}, plain),
            "language-modeling-mask": (transformers.DataCollatorForLanguageModeling, {}, rows),
            "language-modeling-ids": (
                transformers.DataCollatorForLanguageModeling,
                {},
                [row["input_ids"] for row in plain],
            ),
            "language-modeling-np": (transformers.DataCollatorForLanguageModeling, {"return_tensors": "np"}, plain),
            "causal-language-modeling": (transformers.DataCollatorForLanguageModeling, {"mlm": False}, plain),
        }
        for name, (collator, options, batch) in cases.items():
            options = {**options, "pad_to_multiple_of": multiple}
            if collator is transformers.DataCollatorForLanguageModeling and options.get("mlm", True):
                # Masks of half the tokens, a fixed seed: the same draws mask the same tokens with the same ids.
                options.update(seed=0, mlm_probability=0.5)
            batches = []
            for tokenizer in (ours, theirs):
                torch.manual_seed(0)
                np.random.seed(0)
                batches.append(collator(tokenizer, **options)(batch))
            assert_same_batch(*batches, f"{name} pad_to_multiple_of={multiple}")
    # Whole-word masking reads the offsets (and `is_fast`); the rows come padded to one length, as it needs.
    encoded = theirs(
        TEXTS,
        padding=True,
        truncation=True,
        max_length=30,
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
    )
    whole_words = [dict(zip(encoded, values, strict=True)) for values in zip(*encoded.values(), strict=True)]
    batches = []
    for tokenizer in (ours, theirs):
        collator = transformers.DataCollatorForLanguageModeling(
            tokenizer, whole_word_mask=True, mask_replace_prob=1.0, random_replace_prob=0.0, seed=0
        )
        batches.append(collator(whole_words))
    assert_same_batch(*batches, "whole-word")
    # default_data_collator on each tokenizer's own rows, padded by the tokenizer.
    padded = [features(tokenizer, padding="max_length", max_length=16, truncation=True) for tokenizer in (ours, theirs)]
    assert_same_batch(*(transformers.default_data_collator(rows) for rows in padded), "default")


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_pad_and_call_as_transformers(model_type, tokenizer_folders):
    """`pad` on what users and collators give it (a list of dicts, a dict of lists, one example, tensors), with each
    padding strategy, and `__call__`'s `pad_to_multiple_of`."""
    for padding_side in SIDES:
        ours, theirs = both_tokenizers(tokenizer_folders(model_type), padding_side)
        rows = features(theirs, return_special_tokens_mask=True, return_token_type_ids=True)
        columns = {key: [row[key] for row in rows] for key in rows[0]}
        tensors = [{key: torch.tensor(value) for key, value in row.items()} for row in rows[:2]]
        calls = {
            "list": (rows, {}),
            "dict-of-lists": (columns, {"return_tensors": "pt"}),
            "one-example": (rows[0], {"padding": "max_length", "max_length": 30}),
            "one-example-pt": (rows[0], {"padding": "max_length", "max_length": 30, "return_tensors": "pt"}),
            "tensors": (tensors, {}),  # give tensors back
            "tensors-to-np": (tensors, {"return_tensors": "np"}),
            "no-padding": (rows, {"padding": False}),
            "model-max-length": (rows[:2], {"padding": "max_length", "return_tensors": "np"}),
            "multiple": (rows, {"pad_to_multiple_of": 16, "return_tensors": "pt"}),
            "no-attention-mask": ([{"input_ids": row["input_ids"]} for row in rows], {"return_attention_mask": False}),
            "attention-mask-added": ([{"input_ids": row["input_ids"]} for row in rows], {"return_tensors": "pt"}),
            "other-side": (rows, {"padding_side": SIDES[1 - SIDES.index(padding_side)], "return_tensors": "pt"}),
        }
        for name, (inputs, options) in calls.items():
            given = copy.deepcopy(inputs)
            padded = ours.pad(inputs, **options)
            assert repr(inputs) == repr(given), name  # the caller's rows stay as they were (transformers pads one)
            assert_same_batch(padded, theirs.pad(given, **options), f"{padding_side} {name}")
        for options in ({"pad_to_multiple_of": 8}, {"padding": "max_length", "max_length": 12, "truncation": True}):
            call = {"padding": True, "return_special_tokens_mask": True, "return_tensors": "pt", **options}
            assert_same_batch(ours(TEXTS, **call), theirs(TEXTS, **call), f"{padding_side} call {options}")


def test_pad_errors_name_the_argument(tokenizer_folders):
    ours = hfbert.AutoTokenizer.from_pretrained(tokenizer_folders("bert"))
    rows = [ours(text) for text in TEXTS[:2]]
    for options, named in (
        ({"padding": "sideways"}, "padding='sideways'"),
        ({"pad_to_multiple_of": 0}, "pad_to_multiple_of=0"),
        ({"max_length": -2, "padding": "max_length"}, "max_length=-2"),
        ({"return_tensors": "tf"}, "return_tensors='tf'"),
        ({"padding_side": "middle"}, "padding_side"),
    ):
        with pytest.raises(ValueError, match=named):
            ours.pad(rows, **options)
    with pytest.raises(ValueError, match="has no 'input_ids'"):
        ours.pad([{"attention_mask": [1, 1]}])
    with pytest.raises(ValueError, match=r"encoded_inputs\[1\] has no 'attention_mask', which example 0 has"):
        ours.pad([rows[0], {key: rows[1][key] for key in ("input_ids", "token_type_ids")}])
    with pytest.raises(ValueError, match="empty list"):
        ours.pad([])
    # Labels of unequal lengths are not the tokenizer's to pad (as in transformers): the error names them.
    with pytest.raises(ValueError, match="'labels' makes no tensor"):
        ours.pad([{**row, "labels": row["input_ids"]} for row in rows], return_tensors="pt")
    with pytest.raises(NotImplementedError, match="already_has_special_tokens=True"):
        ours.get_special_tokens_mask([7, 8])


def test_trainer_with_hfbert_tokenizer_as_processing_class(tmp_path, request):
    """The usual recipe: Trainer(model, data_collator=DataCollatorWithPadding(tokenizer), processing_class=tokenizer).
    Two steps give the losses of the same run with transformers' tokenizer, and the tokenizer Trainer saves beside
    the model loads in transformers with the same ids."""
    folder = tokenized_checkpoint(tmp_path / "model", "roberta", "sequence-classification", request)
    ours = hfbert.AutoTokenizer.from_pretrained(folder)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    losses = {}
    for name, tokenizer in (("ours", ours), ("theirs", theirs)):
        # Each run's dataset tokenized by its own tokenizer, as a script's `dataset.map(tokenizer)` does.
        dataset = [{**features(tokenizer)[index % len(TEXTS)], "label": index % 3} for index in range(8)]
        arguments = transformers.TrainingArguments(
            output_dir=str(tmp_path / name),
            max_steps=2,
            per_device_train_batch_size=4,
            learning_rate=1e-3,
            seed=0,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
        )
        trainer = transformers.Trainer(
            model=hfbert.AutoModelForSequenceClassification.from_pretrained(folder),
            args=arguments,
            train_dataset=dataset,
            data_collator=transformers.DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8),
            processing_class=tokenizer,
        )
        trainer.train()
        losses[name] = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        trainer.save_model(str(tmp_path / name / "saved"))
    assert len(losses["ours"]) == 2 and losses["ours"] == losses["theirs"]
    for library in (transformers, hfbert):  # the tokenizer Trainer saved, in either library
        reloaded = library.AutoTokenizer.from_pretrained(tmp_path / "ours" / "saved")
        assert reloaded(TEXTS)["input_ids"] == theirs(TEXTS)["input_ids"], library.__name__
