"""Loading: key map on real layouts, wrappers, legacy buffers, shards, dtype, the load report, no random init."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import hfbert
from converters.errors import CheckpointError
from converters.key_map import map_key

from support.checkpoints import REFERENCE, copy_checkpoint
from support.helpers import max_difference, minilm_directory


def reference_output(directory: Path, **kwargs) -> torch.Tensor:
    import transformers

    model = transformers.BertModel.from_pretrained(directory, **kwargs).eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([[101, 7592, 1010, 2088, 999, 102]])).last_hidden_state


def our_output(model: hfbert.BertModel) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([[101, 7592, 1010, 2088, 999, 102]])).last_hidden_state


def test_key_map_turns_bert_base_layout_into_transformers_names():
    import transformers

    layout = json.loads((REFERENCE / "layout.json").read_text())
    config = transformers.BertConfig.from_pretrained(REFERENCE)
    with torch.device("meta"):
        expected = set(transformers.BertModel(config).state_dict())
    mapped = [map_key(name) for name in layout["model.safetensors.tensors"]]
    assert sorted(m.target for m in mapped if m.action in ("loaded", "renamed")) == sorted(expected)
    ignored = sorted(m.source for m in mapped if m.action == "ignored")
    assert ignored == sorted(name for name in layout["model.safetensors.tensors"] if name.startswith("cls."))
    assert len(ignored) == 7


def test_bert_base_layout_report(layout):
    model, info = hfbert.BertModel.from_pretrained(layout.safetensors, output_loading_info=True)
    report = info["report"]
    assert (info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"], info["error_msgs"]) == (
        set(),
        set(),
        set(),
        [],
    )
    backbone = 5 + 16 * layout.config["num_hidden_layers"] + 2  # embeddings, 16 a layer, pooler: 199 in bert-base
    assert len(report.loaded) == backbone and len(report.ignored_by_design) == 7
    assert len(report.renamed) == backbone  # every backbone tensor has the bert. prefix; some are gamma/beta too
    assert "ignored by design" in str(report) and "pre-training head" in str(report)
    assert not model.training


def test_pickle_checkpoint_with_shared_decoder_storage(layout):
    model, info = hfbert.BertModel.from_pretrained(layout.pickle, output_loading_info=True)
    assert len(info["report"].ignored_by_design) == 8  # 7 cls.* tensors + the tied decoder weight
    assert max_difference(our_output(model), reference_output(layout.safetensors)) <= 1e-5


@pytest.mark.parametrize("wrapper", ["module.", "_orig_mod.", "_orig_mod.module.", "module.bert."])
def test_training_wrappers_are_stripped(wrapper, tmp_path):
    tensors = {wrapper + name: tensor for name, tensor in load_file(minilm_directory() / "model.safetensors").items()}
    directory = copy_checkpoint(minilm_directory(), tmp_path / "wrapped", tensors)
    model = hfbert.BertModel.from_pretrained(directory)
    assert max_difference(our_output(model), reference_output(minilm_directory())) <= 1e-5


def test_only_layernorm_gamma_beta_are_renamed(tmp_path):
    tensors = load_file(minilm_directory() / "model.safetensors")
    tensors["encoder.layer.0.attention.self.gamma"] = torch.zeros(3)
    directory = copy_checkpoint(minilm_directory(), tmp_path / "gamma", tensors)
    with pytest.raises(
        CheckpointError, match=r"unexpected in the checkpoint: encoder\.layer\.0\.attention\.self\.gamma"
    ):
        hfbert.BertModel.from_pretrained(directory)
    model, info = hfbert.BertModel.from_pretrained(directory, strict=False, output_loading_info=True)
    assert info["unexpected_keys"] == {"encoder.layer.0.attention.self.gamma"}


def test_legacy_position_ids_are_checked(tmp_path):
    tensors = load_file(minilm_directory() / "model.safetensors")
    assert torch.equal(tensors["embeddings.position_ids"][0], torch.arange(512))  # the real file stores them
    tensors["embeddings.position_ids"] = torch.arange(512).flip(0)[None]
    directory = copy_checkpoint(minilm_directory(), tmp_path / "positions", tensors)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: legacy buffer 'embeddings\.position_ids'"):
        hfbert.BertModel.from_pretrained(directory)
    tensors["embeddings.position_ids"] = torch.arange(512)[None]
    tensors["embeddings.token_type_ids"] = torch.zeros(1, 512, dtype=torch.long)
    copy_checkpoint(minilm_directory(), directory, tensors)
    _, info = hfbert.BertModel.from_pretrained(directory, output_loading_info=True)
    assert sorted(info["report"].legacy_buffers) == ["embeddings.position_ids", "embeddings.token_type_ids"]


def test_sharded_checkpoint_written_by_transformers(tmp_path):
    import transformers

    reference = transformers.BertModel.from_pretrained(minilm_directory())
    reference.save_pretrained(tmp_path / "sharded", max_shard_size="20MB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 1
    model = hfbert.BertModel.from_pretrained(tmp_path / "sharded")
    assert max_difference(our_output(model), reference_output(minilm_directory())) <= 1e-5


@pytest.mark.parametrize("shard_name", ["../model.safetensors", "/etc/passwd", "sub/../../x.safetensors"])
def test_shard_names_cannot_escape_the_directory(shard_name, tmp_path):
    directory = tmp_path / "escape"
    directory.mkdir()
    shutil.copy(minilm_directory() / "config.json", directory)
    save_file(load_file(minilm_directory() / "model.safetensors"), tmp_path / "model.safetensors")
    weight_map = {"embeddings.word_embeddings.weight": shard_name}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with pytest.raises(CheckpointError, match="outside the checkpoint directory"):
        hfbert.BertModel.from_pretrained(directory)


def test_pickle_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "code-ran"

    class Exploit:
        def __reduce__(self):
            return (Path.touch, (marker,))

    directory = tmp_path / "evil"
    directory.mkdir()
    shutil.copy(minilm_directory() / "config.json", directory)
    torch.save({"embeddings.word_embeddings.weight": Exploit()}, directory / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin: refused to unpickle"):
        hfbert.BertModel.from_pretrained(directory)
    assert not marker.exists()


@pytest.mark.parametrize("dtype,tolerance", [(torch.bfloat16, 2e-2), (torch.float16, 1e-2), (torch.float64, 1e-5)])
def test_dtype_casts_on_load(dtype, tolerance):
    model = hfbert.BertModel.from_pretrained(minilm_directory(), dtype=dtype)
    assert all(parameter.dtype == dtype for parameter in model.parameters())
    assert model.dtype == dtype
    reference = reference_output(minilm_directory(), dtype=dtype)
    assert max_difference(our_output(model), reference) <= tolerance


def test_stored_dtype_is_kept(tmp_path):
    tensors = {
        name: t.half() if t.is_floating_point() else t
        for name, t in load_file(minilm_directory() / "model.safetensors").items()
    }
    directory = copy_checkpoint(minilm_directory(), tmp_path / "half", tensors)
    model = hfbert.BertModel.from_pretrained(directory)
    assert model.dtype == torch.float16
    assert max_difference(our_output(model), reference_output(directory, dtype=torch.float16)) <= 1e-2


def test_no_random_initialisation(monkeypatch):
    def only_on_meta(original):
        # Module constructors call their init on the meta device, where it costs nothing; real memory must
        # never be initialised.
        def guarded(tensor, *args, **kwargs):
            if tensor.device.type != "meta":
                raise AssertionError("from_pretrained must not initialise parameters randomly")
            return original(tensor, *args, **kwargs)

        return guarded

    for name in ("normal_", "uniform_", "kaiming_uniform_", "trunc_normal_", "xavier_uniform_", "zeros_", "ones_"):
        monkeypatch.setattr(torch.nn.init, name, only_on_meta(getattr(torch.nn.init, name)))
    for name in ("normal_", "uniform_", "zero_", "fill_"):
        monkeypatch.setattr(torch.Tensor, name, only_on_meta(getattr(torch.Tensor, name)))
    model = hfbert.BertModel.from_pretrained(minilm_directory())
    assert all(parameter.device.type == "cpu" for parameter in model.parameters())
    assert not model.training
    stored = load_file(minilm_directory() / "model.safetensors")
    assert torch.equal(model.embeddings.word_embeddings.weight, stored["embeddings.word_embeddings.weight"])


@pytest.mark.slow  # a fresh process loading bert-base; test_loaded_parameters_are_views_of_the_mapped_file in-process
def test_loading_maps_the_file_instead_of_copying(bert_base_safetensors_dir):
    # In a fresh process: private (anonymous) memory grows by far less than the 440 MB file, since parameters are
    # views of the memory-mapped file (a copy, or a random init followed by a copy, would add at least 440 MB).
    # Pages of the file itself that the load reads (the NaN / Inf check) are shared page cache, not a copy.
    script = f"""
import re, torch, hfbert
hfbert.BertModel.from_pretrained({str(minilm_directory())!r})  # pay one-time costs first
def resident_mb():
    return int(re.search(r"RssAnon:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) / 1024
before = resident_mb()
model = hfbert.BertModel.from_pretrained({str(bert_base_safetensors_dir)!r})
print(resident_mb() - before)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    growth_mb = float(result.stdout.strip().splitlines()[-1])
    assert growth_mb < 50, f"loading a 440 MB checkpoint grew private memory by {growth_mb:.0f} MB"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the mappings in /proc/self/maps")
def test_loaded_parameters_are_views_of_the_mapped_file(small_layout_safetensors_dir):
    """In-process, on the small layout: every parameter's memory lies in a mapping of model.safetensors, so loading
    copies nothing (test_loading_maps_the_file_instead_of_copying measures it on bert-base in a fresh process)."""
    model = hfbert.BertModel.from_pretrained(small_layout_safetensors_dir)
    path = str((small_layout_safetensors_dir / "model.safetensors").resolve())
    with open("/proc/self/maps") as maps:
        lines = [line.split() for line in maps if line.rstrip().endswith(" " + path)]
    ranges = [tuple(int(bound, 16) for bound in line[0].split("-")) for line in lines]
    assert ranges, path
    for name, parameter in model.named_parameters():
        assert any(start <= parameter.data_ptr() < end for start, end in ranges), name


def test_missing_pooler_strict_and_not_strict(tmp_path):
    tensors = {
        name: t for name, t in load_file(minilm_directory() / "model.safetensors").items() if "pooler" not in name
    }
    directory = copy_checkpoint(minilm_directory(), tmp_path / "no-pooler", tensors)
    with pytest.raises(CheckpointError, match="add_pooling_layer=False"):
        hfbert.BertModel.from_pretrained(directory)
    model = hfbert.BertModel.from_pretrained(directory, add_pooling_layer=False)
    assert model.pooler is None and max_difference(our_output(model), reference_output(minilm_directory())) <= 1e-5
    model, info = hfbert.BertModel.from_pretrained(directory, strict=False, output_loading_info=True)
    assert info["report"].missing == info["report"].initialized == ["pooler.dense.weight", "pooler.dense.bias"]
    assert info["missing_keys"] == {"pooler.dense.weight", "pooler.dense.bias"}  # a set, as in transformers
    assert not any(parameter.is_meta for parameter in model.parameters())


@pytest.mark.parametrize("bad_value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights_are_reported_and_rejected(bad_value, tmp_path):
    tensors = load_file(minilm_directory() / "model.safetensors")
    tensors["encoder.layer.4.attention.self.key.weight"][7, 3] = bad_value
    directory = copy_checkpoint(minilm_directory(), tmp_path / "non-finite", tensors)
    with pytest.raises(
        CheckpointError, match=r"not finite: encoder\.layer\.4\.attention\.self\.key\.weight .* \(7, 3\)"
    ):
        hfbert.BertModel.from_pretrained(directory)
    model, info = hfbert.BertModel.from_pretrained(directory, strict=False, output_loading_info=True)
    assert [name for name, _ in info["report"].non_finite] == ["encoder.layer.4.attention.self.key.weight"]
    assert "NaN / Inf values" in str(info["report"])


@pytest.mark.parametrize("source", [None, 3, b"folder", object()], ids=["None", "int", "bytes", "object"])
@pytest.mark.parametrize(
    "load",
    [
        hfbert.BertModel.from_pretrained,
        hfbert.AutoModel.from_pretrained,
        hfbert.AutoModelForMaskedLM.from_pretrained,
        hfbert.BertConfig.from_pretrained,
        hfbert.AutoTokenizer.from_pretrained,
        hfbert.BertTokenizer.from_pretrained,
    ],
    ids=lambda load: load.__qualname__,
)
def test_a_source_that_is_not_a_path_is_refused_naming_the_argument(load, source):
    """`from_pretrained(None)` (a variable left unset) says which argument and what it got, as one TypeError, not a
    TypeError from inside path handling; an empty string likewise, as a ValueError."""
    with pytest.raises(TypeError, match=r"^pretrained_model_name_or_path: expected a local directory or a Hub repo id"):
        load(source)
    with pytest.raises(ValueError, match=r"^pretrained_model_name_or_path: empty"):
        load("")
