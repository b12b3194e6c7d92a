"""Repo ids resolve through huggingface_hub's cache (HF_HUB_CACHE / HF_HOME, HF_HUB_OFFLINE, revision).

huggingface_hub reads its environment variables at import, so each case runs in a fresh process. The cache is
laid out exactly as huggingface_hub writes it (blobs/, snapshots/<sha>/ symlinks, refs/main); transformers,
pointed at the same cache, is the reference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from support.helpers import minilm_directory
from support.robust import DEEP_JSON

REPO_ID = "hfbert-tests/minilm"
MAIN_SHA = "a" * 40
OLD_SHA = "b" * 40


def add_snapshot(cache: Path, sha: str, files: dict[str, bytes]) -> None:
    import hashlib

    repo = cache / ("models--" + REPO_ID.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot = repo / "snapshots" / sha
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("hf-home") / "hub"
    source = minilm_directory()
    files = {name: (source / name).read_bytes() for name in ("config.json", "model.safetensors")}
    add_snapshot(cache, MAIN_SHA, files)
    # An older revision with different weights: every tensor scaled, so outputs differ.
    old = {
        name: tensor * 0.5 if tensor.is_floating_point() else tensor
        for name, tensor in load_file(source / "model.safetensors").items()
    }
    old_path = tmp_path_factory.mktemp("old") / "model.safetensors"
    save_file(old, old_path)
    add_snapshot(cache, OLD_SHA, {"config.json": files["config.json"], "model.safetensors": old_path.read_bytes()})
    refs = cache / ("models--" + REPO_ID.replace("/", "--")) / "refs"
    refs.mkdir()
    (refs / "main").write_text(MAIN_SHA)
    return cache


COMPARE = """
import sys, torch, hfbert, transformers
repo, revision = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
ids = torch.tensor([[101, 7592, 2088, 102]])
ours = hfbert.BertModel.from_pretrained(repo, revision=revision)
theirs = transformers.BertModel.from_pretrained(repo, revision=revision).eval()
with torch.no_grad():
    difference = (ours(input_ids=ids).last_hidden_state - theirs(input_ids=ids).last_hidden_state).abs().max()
print(float(difference), float(ours.embeddings.word_embeddings.weight.abs().sum()))
"""


def run(script: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    full_env = {key: value for key, value in os.environ.items() if not key.startswith("HF_")}
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=full_env)


@pytest.mark.slow  # a CLI subprocess per revision and cache variable
@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HF_HOME"])
def test_offline_cache_and_revisions(variable, hub_cache):
    env = {"HF_HUB_OFFLINE": "1", variable: str(hub_cache if variable == "HF_HUB_CACHE" else hub_cache.parent)}
    main = run(COMPARE, REPO_ID, env=env)
    assert main.returncode == 0, main.stderr
    old = run(COMPARE, REPO_ID, OLD_SHA, env=env)
    assert old.returncode == 0, old.stderr
    main_difference, main_sum = map(float, main.stdout.split())
    old_difference, old_sum = map(float, old.stdout.split())
    assert main_difference <= 1e-5 and old_difference <= 1e-5
    assert old_sum == pytest.approx(main_sum * 0.5, rel=1e-4)  # the pinned revision's weights, not main's


def test_offline_repo_not_in_cache_is_a_clear_error(hub_cache):
    # An OSError too, as transformers' own offline miss: `except OSError` fallbacks written around it catch it.
    script = (
        "import hfbert\ntry:\n    hfbert.BertModel.from_pretrained('someone/not-cached')\n"
        "except OSError as error:\n    assert isinstance(error, hfbert.CheckpointError)\n    raise"
    )
    result = run(script, env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache)})
    assert result.returncode != 0
    assert "CheckpointNotFoundError: someone/not-cached: not found in the Hugging Face cache" in result.stderr
    assert "HF_HUB_OFFLINE is set" in result.stderr


def test_unreachable_hub_falls_back_to_the_cache(hub_cache):
    # An endpoint on a closed local port: the metadata call fails at once, the cached snapshot is used.
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_CACHE": str(hub_cache), "HF_HUB_ETAG_TIMEOUT": "2"}
    script = "import hfbert; m = hfbert.BertModel.from_pretrained('hfbert-tests/minilm'); print(m.config.hidden_size)"
    result = run(script, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "384"


def test_import_hfbert_imports_neither_transformers_nor_the_hub_client():
    script = "import sys, hfbert; print(sorted(m for m in ('transformers', 'huggingface_hub') if m in sys.modules))"
    result = run(script, env={})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_verified_blob_is_not_hashed_again_until_it_changes(tmp_path, monkeypatch):
    """The offline sha256 check of a cached weight file reads it whole (0.4-1.0 s for 440 MB) on every load; a
    blob that hashed right and has not changed since keeps a proof and is not rehashed. Any change to the blob,
    even one that puts its mtime back, changes its ctime and is hashed again, and caught."""
    import converters.hub as hub

    cache = tmp_path / "hub"
    source = minilm_directory()
    add_snapshot(cache, MAIN_SHA, {name: (source / name).read_bytes() for name in ("config.json", "model.safetensors")})
    hashed = []
    original = hub.sha256_of
    monkeypatch.setattr(hub, "sha256_of", lambda path: hashed.append(Path(path).name) or original(path))

    first = hub.download(REPO_ID, MAIN_SHA, offline=True, cache_dir=cache)
    names = ["config.json", "model.safetensors"]  # add_snapshot names every blob by its sha256
    assert hashed == names and list(first.verified_sha256) == names
    second = hub.download(REPO_ID, MAIN_SHA, offline=True, cache_dir=cache)
    assert hashed == names and second.verified_sha256 == first.verified_sha256  # proven, not hashed again

    blob = (first.directory / "model.safetensors").resolve()
    status = blob.stat()
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    os.utime(blob, ns=(status.st_atime_ns, status.st_mtime_ns))  # same size, same mtime: only ctime tells
    with pytest.raises(hub.CheckpointError, match="sha256 mismatch"):
        hub.download(REPO_ID, MAIN_SHA, offline=True, cache_dir=cache)
    assert hashed == [*names, "model.safetensors"]  # only the changed blob


def test_where_no_proof_can_be_kept_every_load_is_verified(tmp_path, monkeypatch):
    """A cache hfbert cannot write its proof into (read-only, or the proof folder taken by a file) is hashed on
    every load, as before."""
    import converters.hub as hub

    cache = tmp_path / "hub"
    add_snapshot(cache, MAIN_SHA, {"model.safetensors": (minilm_directory() / "model.safetensors").read_bytes()})
    (cache / ("models--" + REPO_ID.replace("/", "--")) / hub.PROOF_FOLDER).write_text("not a folder")
    hashed = []
    original = hub.sha256_of
    monkeypatch.setattr(hub, "sha256_of", lambda path: hashed.append(path) or original(path))
    for _ in range(2):
        assert list(hub.download(REPO_ID, MAIN_SHA, offline=True, cache_dir=cache).verified_sha256) == [
            "model.safetensors"
        ]
    assert len(hashed) == 2


def test_a_proof_nested_deeply_is_no_proof(tmp_path, monkeypatch):
    """The proof of a cache blob is hfbert's own file: one that cannot be read (nested 100,000 deep) proves nothing,
    so the blob is hashed again (not a RecursionError) and a good proof written over it."""
    import converters.hub as hub

    cache = tmp_path / "hub"
    add_snapshot(cache, MAIN_SHA, {"model.safetensors": (minilm_directory() / "model.safetensors").read_bytes()})
    first = hub.download(REPO_ID, MAIN_SHA, offline=True, cache_dir=cache)
    sha256 = first.verified_sha256["model.safetensors"]
    proof = cache / ("models--" + REPO_ID.replace("/", "--")) / hub.PROOF_FOLDER / sha256
    assert proof.is_file()
    proof.write_text(DEEP_JSON)
    hashed = []
    original = hub.sha256_of
    monkeypatch.setattr(hub, "sha256_of", lambda path: hashed.append(path) or original(path))
    assert hub.download(REPO_ID, MAIN_SHA, offline=True, cache_dir=cache).verified_sha256 == first.verified_sha256
    assert len(hashed) == 1 and isinstance(json.loads(proof.read_text()), dict)
