"""Where the inputs of a parity run lie (the model, its reference, every artifact given to `hfbert parity
--artifact`), resolved once: `resolve_paths`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hfbert.tools.parity.engines.base import ArtifactError


@dataclass(frozen=True)
class ParityPaths:
    """The local paths of a parity run, and the names given for them. `model`: the model as given (a folder or a Hub
    repo id); `directory`: its local folder; `reference`: the reference's local folder, None for the model itself;
    `artifacts`: each artifact's local path, `artifact_names` what the report calls them."""

    model: str
    directory: Path
    reference: Path | None = None
    artifacts: tuple[Path, ...] = ()
    artifact_names: tuple[str, ...] = ()

    @property
    def reference_directory(self) -> Path:
        return self.reference if self.reference is not None else self.directory


def resolve_paths(
    model_path: str | os.PathLike,
    revision: str | None = None,
    *,
    reference: str | os.PathLike | None = None,
    artifacts: Sequence[str | os.PathLike] = (),
    artifact_names: Sequence[str] | None = None,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
) -> ParityPaths:
    """Where a parity run's inputs lie, resolved once: `model_path` (a local directory, or a Hub repo id at
    `revision`, downloaded and verified with its tokenizer, and its sentence-transformers files when there are
    artifacts: their pipeline is applied to the artifacts' outputs); `reference`, the checkpoint transformers loads
    instead (default: the model), e.g. to check a converted or re-saved copy against its original; each of
    `artifacts` (a .onnx file, an OpenVINO .xml, a CTranslate2 folder; a relative path not found here is looked up
    inside the model, on the Hub for a repo id: `resolve_artifact`), named `artifact_names` in the report (default:
    as given). `cache_dir`, `token`: for Hub repo ids, as in huggingface_hub."""
    from converters.hub import resolve_checkpoint

    hub = {"cache_dir": cache_dir, "token": token}
    include = {"include_sentence_transformers": True} if artifacts else {}
    directory = Path(resolve_checkpoint(model_path, revision, include_tokenizer=True, **hub, **include))
    return ParityPaths(
        model=str(model_path),
        directory=directory,
        reference=Path(resolve_checkpoint(reference, **hub)) if reference is not None else None,
        artifacts=tuple(resolve_artifact(artifact, model_path, directory, **hub) for artifact in artifacts),
        artifact_names=tuple(str(name) for name in (artifact_names or artifacts)),
    )


def resolve_artifact(
    artifact: str | os.PathLike,
    model_path: str | os.PathLike,
    directory: Path,
    *,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
) -> Path:
    """The local path of `artifact`: a local file or folder, or a path inside the model. `model_path`: the model as
    given (a folder or a Hub repo id); `directory`: its local folder (for a repo id, the cached snapshot, named by its
    commit, where the artifact is downloaded at that commit, with the same sha256 checks as the model's files)."""
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
