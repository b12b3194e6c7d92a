"""Issue 49, loading and module structure, every family member against transformers 5:

- masked LMs with untied embeddings (transformers 5 unties the decoder's bias too), and tied configs whose checkpoint
  stores the biases apart, load as transformers loads them and round-trip through hfbert's save_pretrained;
- the embeddings' parameter order, BERT's and RoBERTa's (every class's parameter and state dict order, and an
  optimizer state saved from transformers' model: test_family_conformance.py);
- ignore_mismatched_sizes warns, naming tensor and shapes; the missing-pooler refusal names strict=False;
- resize_token_embeddings(pad_to_multiple_of=<not an int>) says what transformers says;
- a checkpoint that is not there raises an OSError too; subfolder= loads from a folder inside a checkpoint or repo.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import hfbert
from converters.errors import CheckpointError, CheckpointNotFoundError
from hfbert.modeling.family import member as family_member

from support.fake_hub import FakeHub
from support.family import family_checkpoint
from support.helpers import randomize_weights
from support.members import tiny_config

SIZES = tiny_config("bert")  # the family's tiny config (support.members), BERT's two token types
# Where each member's masked LM keeps its head: (the head module, its decoder's names, the word embeddings' name).
MLM_HEADS = {
    "bert": ("cls.predictions", "bert.embeddings.word_embeddings.weight"),
    "roberta": ("lm_head", "roberta.embeddings.word_embeddings.weight"),
    "xlm-roberta": ("lm_head", "roberta.embeddings.word_embeddings.weight"),
    "camembert": ("lm_head", "roberta.embeddings.word_embeddings.weight"),
    "mpnet": ("lm_head", "mpnet.embeddings.word_embeddings.weight"),
}


def prefix(model_type: str) -> str:
    """transformers' (and hfbert's) class-name prefix of the member: "XLMRoberta", "MPNet" ..."""
    return family_member(model_type).reference


def transformers_model(member: str, task: str, **fields):
    import transformers

    config = getattr(transformers, f"{prefix(member)}Config")(**tiny_config(member, **fields))
    return getattr(transformers, f"{prefix(member)}{task}")(config)


def hfbert_model(member: str, task: str, **fields):
    config = getattr(hfbert, f"{prefix(member)}Config")(**tiny_config(member, **fields))
    return getattr(hfbert, f"{prefix(member)}{task}")(config)


def input_ids() -> torch.Tensor:
    # No pad ids (0 for BERT, 1 for the others): positions are then the same whatever the member's scheme.
    return torch.randint(3, SIZES["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(1))


def trained_masked_lm(member: str, tied: bool):
    """transformers' masked LM with random weights after one Adam step on a masked-LM loss: with untied embeddings
    its decoder's bias moves and `bias` (not read by forward) does not, so the two differ as in a fine-tuned model."""
    torch.manual_seed(0)
    model = randomize_weights(transformers_model(member, "ForMaskedLM", tie_word_embeddings=tied))
    if not tied:
        head = model.get_submodule(MLM_HEADS[member][0])
        with torch.no_grad():
            head.decoder.bias.copy_(head.bias)  # equal before the step, so that the step is what separates them
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    ids = input_ids()
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    return model.eval()


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids()).logits


def transformers_class(member: str, task: str):
    import transformers

    return getattr(transformers, f"{prefix(member)}{task}")


# -- 1. the masked-LM decoder's bias follows tie_word_embeddings, as in transformers 5 ----------------------------


@pytest.mark.parametrize("member", list(MLM_HEADS))
def test_untied_masked_lm_after_training_loads_and_round_trips(member, tmp_path):
    theirs = trained_masked_lm(member, tied=False)
    head, _ = MLM_HEADS[member]
    stored = theirs.get_submodule(head)
    assert not torch.equal(stored.bias, stored.decoder.bias)  # the case: the biases differ
    theirs.save_pretrained(tmp_path / "theirs")
    reloaded = transformers_class(member, "ForMaskedLM").from_pretrained(tmp_path / "theirs").eval()

    ours = getattr(hfbert, f"{prefix(member)}ForMaskedLM").from_pretrained(tmp_path / "theirs")
    ours_head = ours.get_submodule(head)
    assert ours_head.decoder.bias is not ours_head.bias
    assert torch.equal(ours_head.decoder.bias, stored.decoder.bias) and torch.equal(ours_head.bias, stored.bias)
    torch.testing.assert_close(logits(ours), logits(reloaded), atol=1e-5, rtol=1e-5)

    ours.save_pretrained(tmp_path / "ours")
    again = transformers_class(member, "ForMaskedLM").from_pretrained(tmp_path / "ours").eval()
    torch.testing.assert_close(logits(again), logits(reloaded), atol=1e-5, rtol=1e-5)
    for name, parameter in reloaded.state_dict().items():
        assert torch.equal(again.state_dict()[name], parameter), name


@pytest.mark.parametrize("member", list(MLM_HEADS))
def test_tied_masked_lm_whose_checkpoint_stores_the_biases_apart_loads_as_transformers(member, tmp_path, caplog):
    theirs = trained_masked_lm(member, tied=True)
    theirs.save_pretrained(tmp_path)
    head, embeddings = MLM_HEADS[member]
    tensors = load_file(tmp_path / "model.safetensors")
    assert f"{head}.decoder.bias" not in tensors  # stored once, as transformers writes a tie
    tensors[f"{head}.decoder.bias"] = tensors[f"{head}.bias"] + 0.5  # as a tool that unties them would write them
    tensors[f"{head}.decoder.weight"] = tensors[embeddings].clone()  # the weight's tie written out
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    reloaded = transformers_class(member, "ForMaskedLM").from_pretrained(tmp_path).eval()
    assert reloaded.get_submodule(head).decoder.bias is not reloaded.get_submodule(head).bias

    with caplog.at_level(logging.WARNING, logger="hfbert"):
        ours = getattr(hfbert, f"{prefix(member)}ForMaskedLM").from_pretrained(tmp_path)
    ours_head = ours.get_submodule(head)
    assert ours_head.decoder.bias is not ours_head.bias
    assert ours_head.decoder.weight is ours.get_input_embeddings().weight  # this tie holds: both copies are equal
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any(f"{head}.decoder.bias" in message and "tie_word_embeddings" in message for message in warnings)
    torch.testing.assert_close(logits(ours), logits(reloaded), atol=1e-5, rtol=1e-5)

    ours.save_pretrained(tmp_path / "ours")
    assert f"{head}.decoder.bias" in load_file(tmp_path / "ours" / "model.safetensors")
    again = transformers_class(member, "ForMaskedLM").from_pretrained(tmp_path / "ours").eval()
    torch.testing.assert_close(logits(again), logits(reloaded), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("member", list(MLM_HEADS))
def test_tied_masked_lm_stays_tied_through_save_and_reload(member, tmp_path):
    theirs = trained_masked_lm(member, tied=True)
    theirs.save_pretrained(tmp_path / "theirs")
    reloaded = transformers_class(member, "ForMaskedLM").from_pretrained(tmp_path / "theirs").eval()
    ours = getattr(hfbert, f"{prefix(member)}ForMaskedLM").from_pretrained(tmp_path / "theirs")
    ours.save_pretrained(tmp_path / "ours")
    for directory in ("theirs", "ours"):
        model = getattr(hfbert, f"{prefix(member)}ForMaskedLM").from_pretrained(tmp_path / directory)
        head = model.get_submodule(MLM_HEADS[member][0])
        assert head.decoder.weight is model.get_input_embeddings().weight, directory
        assert head.decoder.bias is head.bias, directory
        torch.testing.assert_close(logits(model), logits(reloaded), atol=1e-5, rtol=1e-5)
    again = transformers_class(member, "ForMaskedLM").from_pretrained(tmp_path / "ours")
    assert again.get_submodule(MLM_HEADS[member][0]).decoder.weight is again.get_input_embeddings().weight


@pytest.mark.parametrize("member", ["bert", "roberta"])
def test_a_tie_stored_under_the_other_name_loads_as_transformers(member, tmp_path):
    """transformers ties a pair either way round: a checkpoint holding the decoder's bias and not the head's `bias`
    (as some conversion tools write a tie) gives both the stored values."""
    theirs = trained_masked_lm(member, tied=True)
    theirs.save_pretrained(tmp_path)
    head, _ = MLM_HEADS[member]
    tensors = load_file(tmp_path / "model.safetensors")
    tensors[f"{head}.decoder.bias"] = tensors.pop(f"{head}.bias")
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    reloaded = transformers_class(member, "ForMaskedLM").from_pretrained(tmp_path).eval()
    ours = getattr(hfbert, f"{prefix(member)}ForMaskedLM").from_pretrained(tmp_path)
    assert ours.get_submodule(head).decoder.bias is ours.get_submodule(head).bias
    assert torch.equal(ours.get_submodule(head).bias, tensors[f"{head}.decoder.bias"])
    torch.testing.assert_close(logits(ours), logits(reloaded), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("member", list(MLM_HEADS))
def test_untied_config_with_the_decoder_bias_missing_is_refused_with_the_reason(member, tmp_path):
    """A masked LM saved untied by transformers 4 stores the decoder's bias only as `bias` (they were one tensor
    there); transformers 5 initialises the decoder's bias to zeros. hfbert refuses it strictly, saying why."""
    theirs = trained_masked_lm(member, tied=False)
    theirs.save_pretrained(tmp_path)
    head, _ = MLM_HEADS[member]
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors[f"{head}.decoder.bias"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=rf"missing from the checkpoint: {head}\.decoder\.bias") as refused:
        getattr(hfbert, f"{prefix(member)}ForMaskedLM").from_pretrained(tmp_path)
    assert "before transformers 5" in str(refused.value) and "strict=False" in str(refused.value)
    reloaded = transformers_class(member, "ForMaskedLM").from_pretrained(tmp_path).eval()
    ours = getattr(hfbert, f"{prefix(member)}ForMaskedLM").from_pretrained(tmp_path, strict=False)
    torch.testing.assert_close(logits(ours), logits(reloaded), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("member", list(MLM_HEADS))
def test_untied_resize_grows_the_decoder_bias_as_transformers(member, tmp_path):
    theirs = trained_masked_lm(member, tied=False)
    ours = hfbert_model(member, "ForMaskedLM", tie_word_embeddings=False)
    ours.load_state_dict(theirs.state_dict())
    head, _ = MLM_HEADS[member]
    for model in (theirs, ours):
        model.resize_token_embeddings(107, mean_resizing=True)
    theirs_decoder, ours_decoder = theirs.get_submodule(head).decoder, ours.get_submodule(head).decoder
    torch.testing.assert_close(ours_decoder.bias, theirs_decoder.bias, atol=1e-6, rtol=1e-6)
    assert ours_decoder.weight.shape == theirs_decoder.weight.shape == (107, SIZES["hidden_size"])
    assert ours.get_submodule(head).bias.shape == (107,)  # saved, it loads back (transformers' RoBERTa keeps 99)
    ours.save_pretrained(tmp_path)
    again = transformers_class(member, "ForMaskedLM").from_pretrained(tmp_path).eval()
    kept = SIZES["vocab_size"]  # transformers draws new decoder rows around the old mean with 1e-9 covariance
    torch.testing.assert_close(logits(again)[..., :kept], logits(theirs.eval())[..., :kept], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits(again), logits(theirs), atol=1e-3, rtol=1e-3)


# -- 2. the embeddings' parameter order ---------------------------------------------------------------------------


def test_bert_embeddings_keep_bert_order_and_roberta_takes_its_own():
    import transformers

    bert = hfbert.BertModel(hfbert.BertConfig(**SIZES)).embeddings
    theirs = transformers.BertModel(transformers.BertConfig(**SIZES)).embeddings
    assert [name for name, _ in bert.named_parameters()] == [name for name, _ in theirs.named_parameters()]
    assert [name for name, _ in bert.named_parameters()][:2] == ["word_embeddings.weight", "position_embeddings.weight"]
    roberta = hfbert.RobertaModel(hfbert.RobertaConfig(**tiny_config("roberta"))).embeddings
    assert [name for name, _ in roberta.named_parameters()][-1] == "position_embeddings.weight"


# -- 3. ignore_mismatched_sizes warns ----------------------------------------------------------------------------


def test_ignore_mismatched_sizes_warns_naming_tensor_and_shapes(tmp_path, caplog):
    family_checkpoint(tmp_path, "roberta", task="ForSequenceClassification")
    with caplog.at_level(logging.WARNING, logger="hfbert"):
        model = hfbert.RobertaForSequenceClassification.from_pretrained(
            tmp_path, num_labels=5, ignore_mismatched_sizes=True
        )
    assert model.classifier.out_proj.weight.shape == (5, SIZES["hidden_size"])
    messages = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(messages) == 1, messages
    assert "classifier.out_proj.weight" in messages[0] and "classifier.out_proj.bias" in messages[0]
    assert "(3, 32)" in messages[0] and "(5, 32)" in messages[0] and "(3,)" in messages[0] and "(5,)" in messages[0]
    assert str(tmp_path) in messages[0]


# -- 4. the missing-pooler refusal names the way to accept it -----------------------------------------------------


def test_backbone_from_a_masked_lm_folder_names_strict_false(tmp_path):
    family_checkpoint(tmp_path, "roberta")
    with pytest.raises(CheckpointError) as refused:
        hfbert.RobertaModel.from_pretrained(tmp_path)
    pooler_line = next(line for line in str(refused.value).splitlines() if "no pooler" in line)
    assert "add_pooling_layer=False" in pooler_line and "strict=False" in pooler_line
    model = hfbert.RobertaModel.from_pretrained(tmp_path, strict=False)
    assert model.pooler is not None and not model.pooler.dense.weight.is_meta


# -- 5. resize_token_embeddings(pad_to_multiple_of=<not an int>) --------------------------------------------------


def test_pad_to_multiple_of_that_is_not_an_integer_is_refused_in_transformers_words():
    import transformers

    with pytest.raises(ValueError) as theirs:
        transformers.BertForMaskedLM(transformers.BertConfig(**SIZES)).resize_token_embeddings(pad_to_multiple_of=1.3)
    model = hfbert.BertForMaskedLM(hfbert.BertConfig(**SIZES))
    with pytest.raises(ValueError) as ours:
        model.resize_token_embeddings(pad_to_multiple_of=1.3)
    assert str(ours.value) == str(theirs.value)
    assert model.get_input_embeddings().num_embeddings == SIZES["vocab_size"]  # nothing changed


# -- 6. a checkpoint that is not there is an OSError; subfolder= -------------------------------------------------


def test_missing_local_path_and_file_path_raise_an_os_error(tmp_path):
    (tmp_path / "weights.txt").write_text("not a folder")
    for path in (tmp_path / "nowhere", tmp_path / "weights.txt", str(tmp_path / "a" / "b")):
        with pytest.raises(OSError) as refused:
            hfbert.BertModel.from_pretrained(path)
        assert isinstance(refused.value, CheckpointError) and isinstance(refused.value, CheckpointNotFoundError)
        assert str(path) in str(refused.value)


def test_subfolder_of_a_local_checkpoint_loads_as_transformers(tmp_path):
    family_checkpoint(tmp_path / "sub", "xlm-roberta")
    theirs = transformers_class("xlm-roberta", "ForMaskedLM").from_pretrained(tmp_path, subfolder="sub").eval()
    for loader in (hfbert.XLMRobertaForMaskedLM, hfbert.AutoModelForMaskedLM):
        ours = loader.from_pretrained(tmp_path, subfolder="sub")
        assert type(ours) is hfbert.XLMRobertaForMaskedLM
        torch.testing.assert_close(logits(ours), logits(theirs), atol=1e-5, rtol=1e-5)
    with pytest.raises(CheckpointNotFoundError, match="nowhere"):
        hfbert.XLMRobertaForMaskedLM.from_pretrained(tmp_path, subfolder="nowhere")
    reference_config = transformers_class("xlm-roberta", "Config").from_pretrained(tmp_path, subfolder="sub")
    config = hfbert.XLMRobertaConfig.from_pretrained(tmp_path, subfolder="sub", num_labels=5)
    assert config.hidden_size == reference_config.hidden_size and config.vocab_size == reference_config.vocab_size
    assert config.num_labels == 5
    with pytest.raises(ValueError, match="subfolder"):
        hfbert.XLMRobertaForMaskedLM.from_pretrained(tmp_path / "sub", subfolder="../sub")


HUB_SCRIPT = """
import sys, hfbert
from converters.errors import CheckpointError
try:
    model = hfbert.AutoModelForMaskedLM.from_pretrained(sys.argv[1], subfolder=sys.argv[2])
    print("loaded", type(model).__name__, float(model.lm_head.dense.weight.double().sum()))
except CheckpointError as error:
    print("refused", isinstance(error, OSError), type(error).__name__)
"""


def run_against(hub: FakeHub, cache: Path, repo_id: str, subfolder: str) -> str:
    env = {key: value for key, value in os.environ.items() if not key.startswith("HF_")}
    env.update(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(cache), HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1")
    result = subprocess.run(
        [sys.executable, "-c", HUB_SCRIPT, repo_id, subfolder],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_hub_subfolder_loads_and_an_unknown_repo_is_an_os_error(tmp_path):
    checkpoint = family_checkpoint(tmp_path / "checkpoint", "roberta")
    files = {f"models/mlm/{path.name}": path.read_bytes() for path in checkpoint.iterdir() if path.is_file()}
    files["README.md"] = b"a repo whose model lies in a subfolder"
    expected = float(load_file(checkpoint / "model.safetensors")["lm_head.dense.weight"].double().sum())
    with FakeHub() as hub:
        hub.add_revision("someone/nested", "3" * 40, files)
        assert run_against(hub, tmp_path / "cache", "someone/nested", "models/mlm") == (
            f"loaded RobertaForMaskedLM {expected}"
        )
        assert set(hub.downloads()) == {"models/mlm/config.json", "models/mlm/model.safetensors"}
        assert run_against(hub, tmp_path / "cache", "nobody/nothing", "") == "refused True CheckpointNotFoundError"
        assert run_against(hub, tmp_path / "cache", "someone/nested", "elsewhere").startswith("refused True")
    assert json.loads((checkpoint / "config.json").read_text())["model_type"] == "roberta"
