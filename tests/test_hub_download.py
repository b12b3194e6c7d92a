"""`hfbert download` and Hub repo ids, with the real huggingface_hub client against a Hub on 127.0.0.1.

tests/support/fake_hub.py serves the parts of the Hub protocol the client uses. Each client call runs in a fresh
process, because huggingface_hub reads HF_ENDPOINT and HF_HUB_OFFLINE when it is imported.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support.checkpoints import REFERENCE
from support.fake_hub import FakeHub
from support.helpers import minilm_directory

REPO = "google-bert/bert-base-uncased"
SHA_MAIN = "1" * 40
SHA_OLD = "2" * 40
NEVER_FETCHED = ("tf_model.h5", "flax_model.msgpack", "rust_model.ot", "model.onnx", "coreml/model.mlmodel")


def repo_files(weights: bytes) -> dict[str, bytes]:
    files = {name: (REFERENCE / name).read_bytes() for name in ("config.json", "vocab.txt", "tokenizer_config.json")}
    files["model.safetensors"] = weights
    files.update({name: b"weights the loader must never fetch" * 400 for name in NEVER_FETCHED})
    return files


def scaled_weights(scale: float) -> bytes:
    from safetensors.torch import load_file, save

    tensors = load_file(minilm_directory() / "model.safetensors")
    return save({name: t * scale if t.is_floating_point() else t for name, t in tensors.items()}, {"format": "pt"})


@pytest.fixture(scope="module")
def weights() -> dict[str, bytes]:
    return {"main": scaled_weights(1.0), "old": scaled_weights(0.5)}


@pytest.fixture
def hub(weights):
    minilm_config = (minilm_directory() / "config.json").read_bytes()
    with FakeHub() as server:
        server.add_revision(REPO, SHA_OLD, {**repo_files(weights["old"]), "config.json": minilm_config}, branch=None)
        server.add_revision(REPO, SHA_MAIN, {**repo_files(weights["main"]), "config.json": minilm_config})
        yield server


def hfbert_cli(*arguments: str, hub: FakeHub | None, cache: Path, offline: bool = False) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith("HF_")}
    env.update(HF_HUB_CACHE=str(cache), HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1")
    env["HF_ENDPOINT"] = hub.url if hub is not None else "http://127.0.0.1:9"
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "hfbert.cli", *arguments], capture_output=True, text=True, env=env, timeout=300
    )


def snapshot_of(result: subprocess.CompletedProcess) -> Path:
    line = next(line for line in result.stdout.splitlines() if line.startswith("snapshot"))
    return Path(line.split(maxsplit=1)[1])


def test_fresh_download_fetches_only_what_is_loaded(hub, weights, tmp_path):
    result = hfbert_cli("download", REPO, hub=hub, cache=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(hub.downloads()) == ["config.json", "model.safetensors", "tokenizer_config.json", "vocab.txt"]
    assert sum(path.startswith("/api/models/") for _, path in hub.requests) == 1  # the revision resolved once
    assert f"revision  {SHA_MAIN}" in result.stdout
    assert f"sha256 {hashlib.sha256(weights['main']).hexdigest()} verified" in result.stdout
    snapshot = snapshot_of(result)
    assert snapshot.name == SHA_MAIN and (snapshot / "model.safetensors").read_bytes() == weights["main"]

    import transformers

    import hfbert

    ours = hfbert.BertModel.from_pretrained(snapshot)
    reference = transformers.BertModel.from_pretrained(minilm_directory()).eval()
    ids = torch.tensor([[101, 7592, 2088, 102]])
    with torch.no_grad():
        difference = (ours(input_ids=ids).last_hidden_state - reference(input_ids=ids).last_hidden_state).abs().max()
    assert difference <= 1e-5


def test_from_pretrained_with_a_repo_id_loads_only_the_weights(hub, weights, tmp_path):
    script = (
        "import hfbert; m = hfbert.BertModel.from_pretrained('google-bert/bert-base-uncased'); "
        "print(float(m.embeddings.word_embeddings.weight.double().sum()))"
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("HF_")}
    env.update(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path), HF_HUB_DISABLE_XET="1")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert sorted(hub.downloads()) == ["config.json", "model.safetensors"]
    from safetensors.torch import load

    expected = load(weights["main"])["embeddings.word_embeddings.weight"].double().sum()
    assert float(result.stdout) == pytest.approx(float(expected), rel=1e-9)


def test_pinned_revision_and_one_sha_for_main(hub, weights, tmp_path):
    old = hfbert_cli("download", REPO, "--revision", SHA_OLD, hub=hub, cache=tmp_path)
    assert old.returncode == 0, old.stderr
    assert (snapshot_of(old) / "model.safetensors").read_bytes() == weights["old"]
    main = hfbert_cli("download", REPO, hub=hub, cache=tmp_path)
    assert (snapshot_of(main) / "model.safetensors").read_bytes() == weights["main"]
    # Every file request of the main download names the resolved sha, never the moving branch.
    resolves = [path for method, path in hub.requests if "/resolve/" in path]
    assert resolves and not any("/resolve/main/" in path for path in resolves)


@pytest.mark.slow  # CLI subprocesses against the fake Hub, then offline
def test_offline_reuse_makes_no_network_call(hub, tmp_path):
    assert hfbert_cli("download", REPO, hub=hub, cache=tmp_path).returncode == 0
    hub.stop()
    for offline_flag in (["--offline"], []):
        result = hfbert_cli("download", REPO, *offline_flag, hub=None, cache=tmp_path, offline=not offline_flag)
        assert result.returncode == 0, result.stderr
        assert f"revision  {SHA_MAIN}" in result.stdout and "verified" in result.stdout


def test_corrupted_download_is_detected(hub, weights, tmp_path):
    hub.corrupt(REPO, "model.safetensors")
    result = hfbert_cli("download", REPO, hub=hub, cache=tmp_path)
    assert result.returncode == 1
    expected = hashlib.sha256(weights["main"]).hexdigest()
    assert "model.safetensors: sha256 mismatch: expected " + expected in result.stderr
    assert "Fix: delete" in result.stderr


@pytest.mark.slow  # CLI subprocesses against the fake Hub, the cache altered between them
def test_cache_altered_afterwards_is_detected(hub, tmp_path):
    result = hfbert_cli("download", REPO, hub=hub, cache=tmp_path)
    blob = (snapshot_of(result) / "model.safetensors").resolve()
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    for offline in (False, True):
        again = hfbert_cli("download", REPO, hub=hub, cache=tmp_path, offline=offline)
        assert again.returncode == 1 and "sha256 mismatch" in again.stderr and str(blob) in again.stderr


@pytest.mark.parametrize(
    "case,message",
    [
        ("missing repo", "no such model repository"),
        ("gated repo", "gated repository"),
        ("missing revision", "revision 'v9.9' does not exist"),
    ],
)
def test_hub_errors_are_clear(case, message, hub, tmp_path):
    repo, arguments = REPO, []
    if case == "missing repo":
        repo = "nobody/nothing"
    elif case == "gated repo":
        hub.set_gated(REPO)
    else:
        arguments = ["--revision", "v9.9"]
    result = hfbert_cli("download", repo, *arguments, hub=hub, cache=tmp_path)
    assert result.returncode == 1
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # CLI subprocesses against the fake Hub, twice
def test_interrupted_download_completes_on_retry(hub, weights, tmp_path):
    # huggingface_hub retries a broken transfer 5 times within one call: break every attempt of the first call.
    hub.cut_off_next_download(REPO, "model.safetensors", after_bytes=len(weights["main"]) // 3, times=6)
    first = hfbert_cli("download", REPO, hub=hub, cache=tmp_path)
    assert first.returncode == 1
    second = hfbert_cli("download", REPO, hub=hub, cache=tmp_path)
    assert second.returncode == 0, second.stderr
    assert (snapshot_of(second) / "model.safetensors").read_bytes() == weights["main"]


SENTENCE_REPO = "sentence-transformers/all-MiniLM-L6-v2"
SENTENCE_FILES = (
    "config.json",
    "model.safetensors",
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "README.md",
    "1_Pooling/config.json",
)


def test_embed_with_a_repo_id_runs_the_sentence_transformers_pipeline(tmp_path):
    """A repo id gets the same pipeline as the local directory (a download that fetched neither modules.json
    nor sentence_bert_config.json nor 1_Pooling/, so a 566-token text was cut at 512 instead of 256, with mean
    pooling and no Normalize): element for element sentence-transformers' encode of the real checkpoint."""
    import json

    import numpy as np
    from sentence_transformers import SentenceTransformer

    from hfbert.tools.parity import default_texts

    source = minilm_directory()
    files = {name: (source / name).read_bytes() for name in SENTENCE_FILES}
    files.update({name: b"weights the loader must never fetch" * 400 for name in NEVER_FETCHED})
    long_text = " ".join(default_texts())[:2600]
    texts = ["A short sentence.", long_text]
    reference = SentenceTransformer(str(source), device="cpu")
    assert len(reference.tokenizer(long_text)["input_ids"]) > 512  # over both lengths
    expected = reference.encode(texts, convert_to_numpy=True)
    with FakeHub() as hub:
        hub.add_revision(SENTENCE_REPO, SHA_MAIN, files)
        result = hfbert_cli("embed", SENTENCE_REPO, *texts, hub=hub, cache=tmp_path)
        assert result.returncode == 0, result.stderr
        downloaded = sorted(hub.downloads())
        listed = hfbert_cli("download", SENTENCE_REPO, "--json", hub=hub, cache=tmp_path)
    assert downloaded == sorted(SENTENCE_FILES)
    ours = np.array([json.loads(line)["embedding"] for line in result.stdout.splitlines()], dtype=np.float32)
    assert np.abs(ours - expected).max() <= 1e-6
    assert "Transformer(max_seq_length=256) -> Pooling(mean) -> Normalize" in result.stderr
    assert listed.returncode == 0, listed.stderr
    report = json.loads(listed.stdout)
    assert report["revision"] == SHA_MAIN and Path(report["snapshot"]).name == SHA_MAIN
    assert sorted(file["name"] for file in report["files"]) == sorted(SENTENCE_FILES)
    weights = next(file for file in report["files"] if file["name"] == "model.safetensors")
    assert weights["sha256_verified"] == hashlib.sha256(files["model.safetensors"]).hexdigest()
    assert (Path(report["snapshot"]) / "1_Pooling" / "config.json").read_bytes() == files["1_Pooling/config.json"]


@pytest.mark.parametrize("command", ["convert", "inspect", "parity", "embed", "fill-mask"])
def test_revision_cache_dir_and_token_reach_the_download_on_every_command(command, tmp_path, capsys, monkeypatch):
    """Every command that names a model passes --revision, --cache-dir and --token to the Hub client (they were
    on `download` only)."""
    import converters.hub
    from hfbert.cli import main

    calls = []

    def download(repo_id, revision=None, **options):
        calls.append((repo_id, revision, options))
        raise converters.hub.CheckpointError("stop here")

    monkeypatch.setattr(converters.hub, "download", download)
    rest = {"convert": [tmp_path / "out"], "embed": ["x"], "fill-mask": ["a [MASK]"]}.get(command, [])
    hub_options = ["--revision", "v1", "--cache-dir", str(tmp_path / "cache"), "--token", "hf_secret"]
    assert main([command, "someone/model", *map(str, rest), *hub_options]) == 1
    assert "stop here" in capsys.readouterr().err
    ((repo_id, revision, options),) = calls
    assert (repo_id, revision, options["cache_dir"], options["token"]) == (
        "someone/model",
        "v1",
        str(tmp_path / "cache"),
        "hf_secret",
    )


def test_a_repo_ids_bge_m3_layers_come_with_the_sentence_transformers_files(tmp_path):
    """bge-m3's `sparse_linear.pt` and `colbert_linear.pt` lie beside its weights: `embed --output sparse` on a repo
    id reads them, so they are downloaded with the sentence-transformers files (and nothing else is)."""
    import json

    source = minilm_directory()
    files = {name: (source / name).read_bytes() for name in SENTENCE_FILES}
    layers = {"sparse_linear.pt": b"a pickled Linear" * 10, "colbert_linear.pt": b"another pickled Linear" * 10}
    with FakeHub() as hub:
        hub.add_revision(SENTENCE_REPO, SHA_MAIN, {**files, **layers, "onnx/model.onnx": b"never fetched" * 10})
        listed = hfbert_cli("download", SENTENCE_REPO, "--json", hub=hub, cache=tmp_path)
        downloaded = sorted(hub.downloads())
    assert listed.returncode == 0, listed.stderr
    assert downloaded == sorted([*SENTENCE_FILES, *layers])
    assert sorted(file["name"] for file in json.loads(listed.stdout)["files"]) == sorted([*SENTENCE_FILES, *layers])
