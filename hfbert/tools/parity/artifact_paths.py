"""Where an artifact given to `hfbert parity --artifact` lies: a local file or folder, or a path inside the model
(its local folder, or its Hub repo, downloaded at the model's commit into the same cache with the same sha256 checks
as the model's files: converters.hub.download_artifact)."""

from __future__ import annotations

import os
from pathlib import Path

from hfbert.tools.parity.engines.base import ArtifactError


def resolve_artifact(
    artifact: str | os.PathLike,
    model_path: str | os.PathLike,
    directory: Path,
    *,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
) -> Path:
    """The local path of `artifact`. `model_path`: the model as given (a folder or a Hub repo id); `directory`: its
    local folder (for a repo id, the cached snapshot, named by its commit)."""
    from converters.hub import download_artifact, looks_like_local_path

    path = Path(artifact).expanduser()
    if path.exists():
        return path
    inside = directory / path
    if not path.is_absolute() and inside.exists():
        return inside
    if path.is_absolute() or looks_like_local_path(model_path) or Path(model_path).is_dir():
        raise ArtifactError(f"{artifact}: no such file or folder (here, or inside {model_path})")
    return download_artifact(
        os.fspath(model_path), path.as_posix(), revision=directory.name, cache_dir=cache_dir, token=token
    )
