"""The real google-bert/bert-base-uncased against the outputs transformers' own integration test publishes.

Runs where the checkpoint is reachable (already in the Hugging Face cache, or the Hub answers); skips with that
reason otherwise (these machines have no Hub access).
"""

from __future__ import annotations

import json
import socket
from urllib.parse import urlparse

import pytest
import torch

import hfbert

from support.checkpoints import REFERENCE

REPO_ID = "google-bert/bert-base-uncased"
REVISION = "86b5e0934494bd15c9632b12f734a8a67f723594"


def require_checkpoint() -> None:
    """Skip, saying why, unless the real checkpoint is cached or the Hub answers."""
    reachable, reason = checkpoint_reachable()
    if not reachable:
        pytest.skip(reason)


def checkpoint_reachable() -> tuple[bool, str]:
    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(REPO_ID, "model.safetensors", revision=REVISION), str):
        return True, "cached"
    if constants.HF_HUB_OFFLINE:
        return False, f"{REPO_ID} is not in the Hugging Face cache and HF_HUB_OFFLINE is set"
    endpoint = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=3).close()
    except OSError as error:
        return False, f"{REPO_ID} is not in the Hugging Face cache and the Hub is unreachable ({error})"
    return True, "online"


def test_hidden_state_slice_matches_published_values():
    require_checkpoint()
    expected = json.loads((REFERENCE / "expected.json").read_text())["hidden_state_slice"]
    model = hfbert.BertModel.from_pretrained(REPO_ID, revision=REVISION)
    with torch.no_grad():
        output = model(
            input_ids=torch.tensor(expected["input_ids"]), attention_mask=torch.tensor(expected["attention_mask"])
        )
    torch.testing.assert_close(
        output.last_hidden_state[:, 1:4, 1:4],
        torch.tensor(expected["expected"]),
        atol=expected["atol"],
        rtol=expected["rtol"],
    )


def test_fill_mask_matches_published_scores():
    require_checkpoint()
    cases = json.loads((REFERENCE / "expected.json").read_text())["fill_mask"]
    model = hfbert.BertForMaskedLM.from_pretrained(REPO_ID, revision=REVISION)
    tokenizer = hfbert.BertTokenizer.from_pretrained(REPO_ID, revision=REVISION)
    for case in cases:
        predictions = model.fill_mask(case["text"], tokenizer, top_k=5)
        assert [(p["token_str"], p["token"]) for p in predictions] == [(t, i) for t, i, _ in case["top5"]]
        for prediction, (_, _, score) in zip(predictions, case["top5"], strict=True):
            assert prediction["score"] == pytest.approx(score, abs=1e-4)
