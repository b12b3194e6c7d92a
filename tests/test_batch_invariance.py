"""A row's outputs never depend on the other rows of its batch (issue #64, item 6).

A right-padded row runs padding-free alone or beside full rows, and its pad positions come out zero (the documented
contract). Beside a row with holes in its mask, or a left-padded row, the batch runs padded; the right-padded row
must still get zeros at its pads, not the values a padded computation gives them. transformers' own
`test_batching_equivalence` caught the difference in 5-8% of its runs.

Every row is also held against transformers, element-wise: real tokens everywhere, and the whole row (pads included)
for the rows hfbert computes as transformers does (holes, left padding).
"""

from __future__ import annotations

import pytest
import torch

import hfbert

from support.members import MODEL_TYPES, reference_checkpoint, reference_class, reference_config

transformers = pytest.importorskip("transformers")

WIDTH = 9
ATOL = 1e-5
# Each row's mask; "right" is the row under test, the others are what it is batched with.
MASKS = {
    "right": [1] * 5 + [0] * 4,
    "full": [1] * WIDTH,
    "holes": [1, 1, 0, 1, 1, 1, 0, 1, 0],
    "left": [0] * 3 + [1] * 6,
}
NEIGHBOURS = [(), ("full",), ("holes",), ("left",), ("holes", "left", "full")]


def rows(model_type: str) -> dict[str, torch.Tensor]:
    """One row of ids per mask, never the pad id at a real token."""
    config = reference_config(model_type)
    generator = torch.Generator().manual_seed(0)
    ids = {}
    for name, mask in MASKS.items():
        tokens = torch.randint(3, config.vocab_size, (WIDTH,), generator=generator)
        tokens[tokens == config.pad_token_id] = 4 if config.pad_token_id == 3 else 3
        ids[name] = torch.where(torch.tensor(mask).bool(), tokens, config.pad_token_id)
    return ids


@pytest.fixture(scope="module", params=MODEL_TYPES)
def models(request, tmp_path_factory):
    model_type = request.param
    directory = reference_checkpoint(tmp_path_factory.mktemp(model_type), model_type)
    # hfbert's default kernel (sdpa) against transformers' where it has it: a pad query whose local window holds only
    # pads (ModernBERT's, under left padding) is each kernel's own rule.
    reference = reference_class(model_type)
    attn = "sdpa" if getattr(reference, "_supports_sdpa", False) else "eager"
    theirs = reference.from_pretrained(directory, attn_implementation=attn).eval()
    return model_type, hfbert.AutoModel.from_pretrained(directory).eval(), theirs


def run(model, names: tuple[str, ...], ids: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The last hidden state and every hidden state of each row in `names`, run as one batch."""
    inputs = {
        "input_ids": torch.stack([ids[name] for name in names]),
        "attention_mask": torch.tensor([MASKS[name] for name in names]),
    }
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True)
    return [
        torch.stack([out.last_hidden_state[index], *(s[index] for s in out.hidden_states)])
        for index in range(len(names))
    ]


@pytest.mark.parametrize("neighbours", NEIGHBOURS, ids=lambda names: "+".join(names) or "alone")
def test_a_right_padded_row_gives_the_same_outputs_whatever_it_is_batched_with(models, neighbours):
    model_type, ours, theirs = models
    ids = rows(model_type)
    names = ("right", *neighbours)
    mine, reference = run(ours, names, ids), run(theirs, names, ids)
    real = torch.tensor(MASKS["right"]).bool()
    # The row under test: transformers' values at its real tokens, exact zeros at its pads, in every layer's output.
    torch.testing.assert_close(mine[0][:, real], reference[0][:, real], atol=ATOL, rtol=ATOL)
    assert mine[0][:, ~real].abs().max() == 0, f"{model_type}: pads of a right-padded row beside {neighbours}"
    # Its neighbours: full rows and right padding as the row under test; holes and left padding as transformers, pads
    # included.
    for index, name in enumerate(names[1:], start=1):
        where = torch.tensor(MASKS[name]).bool() if name in ("right", "full") else torch.ones(WIDTH, dtype=torch.bool)
        torch.testing.assert_close(mine[index][:, where], reference[index][:, where], atol=ATOL, rtol=ATOL)


def test_padding_free_off_computes_pads_as_transformers(models):
    """`padding_free = False` is transformers' computation everywhere, pads included, whatever the batch."""
    model_type, ours, theirs = models
    ids = rows(model_type)
    ours.padding_free = False
    try:
        mine, reference = run(ours, ("right", "holes"), ids), run(theirs, ("right", "holes"), ids)
    finally:
        ours.padding_free = True
    for row_mine, row_reference in zip(mine, reference, strict=True):
        torch.testing.assert_close(row_mine, row_reference, atol=ATOL, rtol=ATOL)
