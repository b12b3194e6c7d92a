"""The fake Hub (tests/support/fake_hub.py) speaks enough of the protocol for the real huggingface_hub client.

huggingface_hub reads HF_ENDPOINT and its other variables at import, so each case runs the client in a fresh process.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.fake_hub import FakeHub

REPO = "hfbert-tests/tiny"
OLD, NEW = "1" * 40, "2" * 40
# 100 kB of bytes that differ between revisions: LFS by size and by suffix, so served through the "CDN" redirect.
OLD_WEIGHTS = hashlib.sha256(b"old").digest() * 3200
NEW_WEIGHTS = hashlib.sha256(b"new").digest() * 3200
FILES = {"config.json": b'{"hidden_size": 8}', "vocab.txt": b"[PAD]\n[UNK]\n", "sub/notes.md": b"# notes\n"}


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub() as hub:
        hub.add_revision(REPO, OLD, {**FILES, "model.safetensors": OLD_WEIGHTS}, branch=None)
        hub.add_revision(REPO, NEW, {**FILES, "model.safetensors": NEW_WEIGHTS, "config.json": b'{"hidden_size": 16}'})
        yield hub


def client(hub: FakeHub, cache: Path, code: str) -> object:
    """Run `code` against the fake Hub in a fresh process; it prints one JSON value as its last line."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("HF_")}
    env.update(
        HF_ENDPOINT=hub.url,
        HF_HUB_CACHE=str(cache / "hub"),
        HF_HOME=str(cache / "home"),  # no stored token can leak in
        HF_HUB_DISABLE_XET="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
    )
    script = "import hashlib, json, huggingface_hub as hh\n" + textwrap.dedent(code)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def error_of(hub: FakeHub, cache: Path, call: str) -> str:
    """The class name of the exception `call` (one line of code) raises, or None."""
    code = f"try:\n    {call}\n    print(json.dumps(None))\n"
    code += "except Exception as e:\n    print(json.dumps(type(e).__name__))"
    return client(hub, cache, code)


def sha256_of(path_expression: str) -> str:
    """Code for the sha256 of the file at `path_expression` (itself code)."""
    return f"hashlib.sha256(open({path_expression}, 'rb').read()).hexdigest()"


def download_digest(filename: str, revision: str | None = None) -> str:
    """Code printing the sha256 of the file hf_hub_download returns."""
    return f"print(json.dumps({sha256_of(f'hh.hf_hub_download({REPO!r}, {filename!r}, revision={revision!r})')}))"


def test_model_info_lists_siblings_with_lfs_metadata(hub, tmp_path):
    info = client(
        hub,
        tmp_path,
        f"""
        info = hh.HfApi().model_info({REPO!r}, files_metadata=True)
        print(json.dumps({{"sha": info.sha, "siblings": {{s.rfilename: s.lfs for s in info.siblings}}}}))
        """,
    )
    assert info["sha"] == NEW
    assert info["siblings"]["config.json"] is None
    lfs = info["siblings"]["model.safetensors"]
    assert lfs["sha256"] == hashlib.sha256(NEW_WEIGHTS).hexdigest() and lfs["size"] == len(NEW_WEIGHTS)
    old = client(hub, tmp_path, f"print(json.dumps(hh.HfApi().model_info({REPO!r}, revision={OLD!r}).sha))")
    assert old == OLD


def test_hf_hub_download_small_and_lfs_files(hub, tmp_path):
    assert client(hub, tmp_path, download_digest("vocab.txt")) == hashlib.sha256(FILES["vocab.txt"]).hexdigest()
    assert client(hub, tmp_path, download_digest("model.safetensors")) == hashlib.sha256(NEW_WEIGHTS).hexdigest()
    assert hub.downloads() == ["vocab.txt", "model.safetensors"]
    # The LFS file went through the redirect to the blob server, as it does to the real Hub's CDN.
    assert any(path.startswith("/blobs/") for _, path in hub.requests)


def test_snapshot_download_fetches_only_allowed_files(hub, tmp_path):
    files = client(
        hub,
        tmp_path,
        f"""
        from pathlib import Path
        folder = Path(hh.snapshot_download({REPO!r}, allow_patterns=["*.json", "*.txt"]))
        print(json.dumps(sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())))
        """,
    )
    assert files == ["config.json", "vocab.txt"]
    assert sorted(hub.downloads()) == ["config.json", "vocab.txt"]


def test_revision_pinning_returns_the_pinned_bytes(hub, tmp_path):
    assert client(hub, tmp_path, download_digest("model.safetensors", OLD)) == hashlib.sha256(OLD_WEIGHTS).hexdigest()
    assert client(hub, tmp_path, download_digest("model.safetensors")) == hashlib.sha256(NEW_WEIGHTS).hexdigest()
    # Both are now cached side by side: the pinned snapshot still holds the old config.
    code = f"print(json.dumps(open(hh.snapshot_download({REPO!r}, revision={OLD!r}) + '/config.json').read()))"
    assert client(hub, tmp_path, code) == FILES["config.json"].decode()


def test_errors_map_to_the_client_exceptions(hub, tmp_path):
    assert error_of(hub, tmp_path, "hh.hf_hub_download('nobody/nothing', 'config.json')") == "RepositoryNotFoundError"
    assert error_of(hub, tmp_path, "hh.HfApi().model_info('nobody/nothing')") == "RepositoryNotFoundError"
    assert error_of(hub, tmp_path, f"hh.hf_hub_download({REPO!r}, 'x', revision='nope')") == "RevisionNotFoundError"
    assert error_of(hub, tmp_path, f"hh.HfApi().model_info({REPO!r}, revision='nope')") == "RevisionNotFoundError"
    assert error_of(hub, tmp_path, f"hh.hf_hub_download({REPO!r}, 'missing.json')") == "RemoteEntryNotFoundError"
    hub.set_gated(REPO)
    assert error_of(hub, tmp_path, f"hh.hf_hub_download({REPO!r}, 'config.json')") == "GatedRepoError"
    assert error_of(hub, tmp_path, f"hh.snapshot_download({REPO!r})") == "GatedRepoError"
    assert hub.downloads() == []


def test_cut_off_download_is_retried_in_the_same_call(hub, tmp_path):
    hub.cut_off_next_download(REPO, "model.safetensors", after_bytes=1000)
    digest = client(hub, tmp_path, download_digest("model.safetensors"))
    assert digest == hashlib.sha256(NEW_WEIGHTS).hexdigest()
    # The client reads in 10 MiB chunks and drops a partial one, so it starts over: no Range request.
    assert hub.downloads() == ["model.safetensors", "model.safetensors"] and hub.range_requests == []


def test_cut_off_after_a_full_chunk_resumes_with_a_range_request(hub, tmp_path):
    chunk = 10 * 1024 * 1024  # huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE
    big = hashlib.sha256(b"big").digest() * ((chunk + 5000) // 32)
    hub.add_revision(REPO, "3" * 40, {"big.bin": big})
    hub.cut_off_next_download(REPO, "big.bin", after_bytes=chunk + 1000)
    assert client(hub, tmp_path, download_digest("big.bin")) == hashlib.sha256(big).hexdigest()
    assert hub.range_requests == [("big.bin", f"bytes={chunk}-")]


def test_download_cut_off_every_time_fails_then_a_later_call_completes(hub, tmp_path):
    hub.cut_off_next_download(REPO, "model.safetensors", after_bytes=1000, times=100)
    # The client sleeps 1 s before each of its 5 resume attempts; skip that in this throwaway process.
    call = f"import time; time.sleep = lambda _: None; hh.hf_hub_download({REPO!r}, 'model.safetensors')"
    assert error_of(hub, tmp_path, call) == "RemoteProtocolError"
    hub.cut_off_next_download(REPO, "model.safetensors", after_bytes=0, times=0)
    digest = client(hub, tmp_path, download_digest("model.safetensors"))
    assert digest == hashlib.sha256(NEW_WEIGHTS).hexdigest()


def test_corrupted_file_keeps_its_length_and_advertised_hash(hub, tmp_path):
    hub.corrupt(REPO, "model.safetensors")
    code = f"""
    path = hh.hf_hub_download({REPO!r}, "model.safetensors")
    print(json.dumps([len(open(path, "rb").read()), {sha256_of("path")}]))
    """
    size, digest = client(hub, tmp_path, code)
    # The client does not check sha256 on plain HTTP downloads: catching this is the loader's job.
    assert size == len(NEW_WEIGHTS) and digest != hashlib.sha256(NEW_WEIGHTS).hexdigest()
