"""`hfbert inspect` refuses a checkpoint whose tensors are named for another family than its config.json says, with
the loaders' own message (issue 49): before, it listed every tensor as "loaded as is" and exited 0 for a checkpoint
no loader takes."""

from __future__ import annotations

import json

import pytest
import transformers
from safetensors.torch import load_file, save_file

import hfbert
from hfbert.cli import main
from hfbert.tools.inspect import summary

from support.family import TINY

# (transformers class saved, its tensors' prefix renamed to, config.json's model_type rewritten to, hfbert class)
MISMATCHES = {
    "xlm-roberta config, bert tensors": ("BertForMaskedLM", None, "xlm-roberta", "XLMRobertaModel"),
    "bert config, roberta tensors": ("BertForMaskedLM", "roberta.", None, "BertModel"),
    "mpnet config, roberta tensors": ("MPNetForMaskedLM", "roberta.", None, "MPNetModel"),
    "roberta config, mpnet tensors": ("RobertaForMaskedLM", "mpnet.", None, "RobertaModel"),
}


def mismatched_checkpoint(directory, saved: str, prefix: str | None, model_type: str | None):
    config_class = getattr(transformers, saved.removesuffix("ForMaskedLM") + "Config")
    getattr(transformers, saved)(config_class(**TINY, pad_token_id=1)).save_pretrained(directory)
    if prefix is not None:
        weights = directory / "model.safetensors"
        own = f"{config_class.model_type}."
        save_file({name.replace(own, prefix, 1): t for name, t in load_file(weights).items()}, weights)
    if model_type is not None:
        config = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    return directory


@pytest.mark.parametrize("case", MISMATCHES)
def test_inspect_refuses_what_the_loaders_refuse_with_their_message(tmp_path, capsys, case):
    saved, prefix, model_type, family_class = MISMATCHES[case]
    directory = mismatched_checkpoint(tmp_path / "checkpoint", saved, prefix, model_type)
    with pytest.raises(hfbert.CheckpointError, match="named as a .* checkpoint's, but .* says model_type") as auto:
        hfbert.AutoModel.from_pretrained(directory)
    with pytest.raises(hfbert.CheckpointError) as own:
        getattr(hfbert, family_class).from_pretrained(directory)
    assert str(own.value) == str(auto.value)
    with pytest.raises(hfbert.CheckpointError) as inspected:
        summary(directory)
    assert str(inspected.value) == str(auto.value)
    capsys.readouterr()
    for options in ([], ["--json"]):
        assert main(["inspect", str(directory), *options]) == 1
        out, err = capsys.readouterr()
        assert out == ""
        assert err == f"hfbert inspect: {' '.join(str(auto.value).split())}\n"
