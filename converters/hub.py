"""Turning a path or a Hub repo id into a local checkpoint directory, through `huggingface_hub`.

A local directory is used as it is, with no network. A repo id is resolved to one commit sha first, so every
file comes from the same revision even while `main` moves; then only the files the model loads are downloaded
into the standard Hugging Face cache (`HF_HOME` / `HF_HUB_CACHE` are honoured): `config.json` and the
preferred weight file (see `checkpoint_files.WEIGHT_FILE_PREFERENCE`, `pytorch_model.bin` only when the repo
has no safetensors). With `HF_HUB_OFFLINE=1`, or when the Hub cannot be reached, the cached snapshot is used.
"""

from __future__ import annotations

import os
from pathlib import Path

from converters.checkpoint_files import PICKLE_INDEX, SAFETENSORS_INDEX, WEIGHT_FILE_PREFERENCE, read_shard_index
from converters.errors import CheckpointError

CONFIG_FILE = "config.json"


def resolve_checkpoint(path_or_repo_id: str | os.PathLike, revision: str | None = None) -> Path:
    """A local directory holding config.json and the weights for `path_or_repo_id`."""
    path = Path(path_or_repo_id).expanduser()
    if path.is_dir():
        if revision is not None:
            raise CheckpointError(f"{path}: revision={revision!r} applies to Hub repo ids, not to a local directory")
        return path
    text = str(path_or_repo_id)
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") > 1 or os.sep in text.replace("/", ""):
        raise CheckpointError(f"{text}: not a checkpoint directory (expected a folder holding config.json and weights)")
    return download_checkpoint(text, revision)


def download_checkpoint(repo_id: str, revision: str | None = None) -> Path:
    """Download (or find in the cache) what `from_pretrained` loads from `repo_id`; return the snapshot folder."""
    from huggingface_hub import HfApi, constants, hf_hub_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if constants.HF_HUB_OFFLINE:
        return cached_checkpoint(repo_id, revision, reason="HF_HUB_OFFLINE is set")
    try:
        info = HfApi().model_info(repo_id, revision=revision)
    except GatedRepoError:
        raise CheckpointError(
            f"{repo_id}: gated repository; accept its terms on the Hub and log in (`hf auth login` or HF_TOKEN)"
        ) from None
    except RevisionNotFoundError:
        raise CheckpointError(f"{repo_id}: revision {revision!r} does not exist") from None
    except RepositoryNotFoundError:
        raise CheckpointError(
            f"{repo_id}: no such model repository on {constants.ENDPOINT} (or it is private: log in first)"
        ) from None
    except HFValidationError as error:
        raise CheckpointError(f"{repo_id}: neither a local directory nor a valid repo id ({error})") from None
    except Exception as error:  # no network, DNS failure, timeout, server error: fall back to the cache
        return cached_checkpoint(repo_id, revision, reason=f"the Hub is unreachable ({type(error).__name__}: {error})")

    available = {sibling.rfilename for sibling in info.siblings or []}
    wanted = [CONFIG_FILE] + [name for name in WEIGHT_FILE_PREFERENCE if name in available][:1]
    if len(wanted) == 1:
        raise CheckpointError(
            f"{repo_id}@{info.sha}: no PyTorch weights in the repository "
            f"(looked for {', '.join(WEIGHT_FILE_PREFERENCE)})"
        )
    for filename in wanted:
        local = Path(hf_hub_download(repo_id, filename, revision=info.sha))
    snapshot = local.parent
    if wanted[-1] in (SAFETENSORS_INDEX, PICKLE_INDEX):
        for shard in dict.fromkeys(read_shard_index(snapshot / wanted[-1], must_exist=False).values()):
            hf_hub_download(repo_id, shard.name, revision=info.sha)
    return snapshot


def cached_checkpoint(repo_id: str, revision: str | None, reason: str) -> Path:
    from huggingface_hub import constants, snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except Exception:
        raise CheckpointError(
            f"{repo_id}: not found in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {reason}. "
            f"Download it once with network access, or pass a local directory."
        ) from None
