"""Turning a path or a Hub repo id into a local checkpoint directory, through `huggingface_hub`.

A local directory is used as it is, with no network. A repo id is resolved to one commit sha first, so every
file comes from the same revision even while `main` moves; then only the files hfbert uses are downloaded into
the standard Hugging Face cache (`HF_HOME` / `HF_HUB_CACHE` honoured, or `cache_dir`), with huggingface_hub's
progress bars: `config.json`, the preferred weight file (see `checkpoint_files.WEIGHT_FILE_PREFERENCE`;
`pytorch_model.bin` only when the repo has no safetensors) with its shards, and, when asked, the tokenizer files
and the sentence-transformers files (`SENTENCE_TRANSFORMERS_FILES`: modules.json, 1_Pooling/config.json, ...,
which `hfbert embed` reads). Never the TensorFlow, Flax, Rust, ONNX or Core ML files. `token` is passed to
huggingface_hub (default: its own, from `hf auth login` or HF_TOKEN).

Every LFS file is checked against the sha256 the Hub publishes (offline: the sha256 that names its blob in the
cache), also when it was already cached. Hashing a 440 MB file takes about a second, so a proof is kept: after
a blob hashes right, `<repo folder>/.hfbert-verified/<sha256>` records the blob's size, inode, mtime and ctime;
a later check of the same, unchanged blob (every one of those equal) is not rehashed. Any write to the blob, a
`touch`, a copy over it or a replacement changes its ctime (which no user call can set back), so an altered
blob is always hashed again and caught. A cache that is not writable keeps no proof and is hashed every time.

With `HF_HUB_OFFLINE=1` (or `offline=True`) no network call is made: the cached snapshot is used.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import posixpath
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from converters.checkpoint_files import PICKLE_INDEX, SAFETENSORS_INDEX, WEIGHT_FILE_PREFERENCE, read_shard_index
from converters.errors import CheckpointError, CheckpointNotFoundError

CONFIG_FILE = "config.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",  # RoBERTa's byte-level BPE without tokenizer.json, with merges.txt
    "merges.txt",
)
# The sentence-transformers files a checkpoint may carry beside the backbone, as fnmatch patterns of paths
# relative to the checkpoint directory ("/" separated, as on the Hub). Module folders are named "<index>_<Type>"
# by sentence-transformers (1_Pooling, 2_Dense, 2_Normalize or 3_Normalize, ...), hence the leading "[0-9]*_".
# Both on-disk formats are covered: the one most Hub checkpoints carry (sentence_bert_config.json with
# max_seq_length, pooling booleans in 1_Pooling/config.json, an empty or absent 2_Normalize/) and the one
# sentence-transformers 6.x writes (a config.json in every module folder, Normalize's included). Dense weights
# come as model.safetensors (6.x) or pytorch_model.bin (older). `sentence_transformers_files` applies them.
SENTENCE_TRANSFORMERS_FILES = (
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "README.md",
    "[0-9]*_Pooling/config.json",
    "[0-9]*_SpladePooling/config.json",
    "[0-9]*_Normalize/config.json",
    "[0-9]*_Dense/config.json",
    "[0-9]*_Dense/model.safetensors",
    "[0-9]*_Dense/pytorch_model.bin",
)
# bge-m3's lexical and ColBERT layers beside the weights (hfbert.tools.bge_m3): as the Hub has them, or as
# `hfbert convert` writes them. Downloaded with the sentence-transformers files, which embed asks for.
HEAD_LAYER_FILES = ("sparse_linear.pt", "colbert_linear.pt", "sparse_linear.safetensors", "colbert_linear.safetensors")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def sentence_transformers_files(relative_paths: Iterable[str]) -> list[str]:
    """The paths among `relative_paths` ("/"-separated, relative to a checkpoint) that are
    sentence-transformers files (`SENTENCE_TRANSFORMERS_FILES`), in the order given."""
    return [
        path
        for path in relative_paths
        if any(
            fnmatch.fnmatchcase(path, pattern) and path.count("/") == pattern.count("/")
            for pattern in SENTENCE_TRANSFORMERS_FILES
        )
    ]


@dataclass
class Snapshot:
    """A checkpoint as downloaded: where it lies, which commit, which files, and their verified sha256."""

    directory: Path
    commit: str
    files: list[str] = field(default_factory=list)
    verified_sha256: dict[str, str] = field(default_factory=dict)


def resolve_checkpoint(
    path_or_repo_id: str | os.PathLike,
    revision: str | None = None,
    *,
    include_tokenizer: bool = False,
    include_weights: bool = True,
    include_sentence_transformers: bool = False,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    subfolder: str | os.PathLike | None = "",
) -> Path:
    """A local directory holding config.json, the weights and (if asked) the tokenizer and sentence-transformers
    files for the source. `cache_dir` and `token` apply to Hub repo ids, as in huggingface_hub; `subfolder` is the
    checkpoint's folder inside the directory or repo, as in transformers' `from_pretrained`. Nothing there (no such
    directory, a file, an unknown repo id or revision) raises `CheckpointNotFoundError`, an `OSError` too."""
    checked_source(path_or_repo_id)
    subfolder = checked_subfolder(subfolder)
    path = Path(path_or_repo_id).expanduser()
    if path.is_dir():
        if revision is not None:
            raise CheckpointError(f"{path}: revision={revision!r} applies to Hub repo ids, not to a local directory")
        directory = path / subfolder if subfolder else path
        if not directory.is_dir():
            raise CheckpointNotFoundError(
                f"{directory}: not a checkpoint directory (no folder {subfolder!r} in {path}; subfolder= names the "
                "folder inside it that holds config.json and the weights)"
            )
        return directory
    text = os.fspath(path_or_repo_id)
    if looks_like_local_path(path_or_repo_id):
        what = "a file, " if path.exists() else "no such directory, "
        raise CheckpointNotFoundError(
            f"{text}: not a checkpoint directory ({what}expected a folder holding config.json and weights)"
        )
    snapshot = download(
        text,
        revision,
        cache_dir=cache_dir,
        token=token,
        include_tokenizer=include_tokenizer,
        include_weights=include_weights,
        include_sentence_transformers=include_sentence_transformers,
        subfolder=subfolder,
    )
    return snapshot.directory / subfolder if subfolder else snapshot.directory


def checked_source(path_or_repo_id: object, argument: str = "pretrained_model_name_or_path") -> None:
    """TypeError for a source that is neither a string nor a path (None, a number, a model object), ValueError for an
    empty one, each naming `argument`: the first thing `from_pretrained` checks, so that the error is this one and
    not a TypeError from deep inside path handling."""
    if not isinstance(path_or_repo_id, (str, os.PathLike)):
        raise TypeError(
            f"{argument}: expected a local directory or a Hub repo id (a str or os.PathLike), "
            f"got {type(path_or_repo_id).__name__} {path_or_repo_id!r}"[:300]
        )
    if not os.fspath(path_or_repo_id).strip():
        raise ValueError(f"{argument}: empty; expected a local directory or a Hub repo id")


def checked_subfolder(subfolder: str | os.PathLike | None) -> str:
    """`subfolder` as a "/"-separated path inside a checkpoint ("" for none); ValueError for one that is absolute or
    climbs out with "..", which would read files outside the checkpoint (or the repo's snapshot)."""
    if not subfolder:
        return ""
    path = PurePosixPath(os.fspath(subfolder))
    if path.is_absolute() or ".." in path.parts:
        raise ValueError(
            f"subfolder={os.fspath(subfolder)!r}: expected a folder inside the checkpoint (a relative path, no '..')"
        )
    return "/".join(part for part in path.parts if part != ".")


def looks_like_local_path(path_or_repo_id: str | os.PathLike) -> bool:
    """True for what can only be a path (a Path object, ./x, /x, ~/x, a/b/c, backslashes, an existing file),
    False for what may be a Hub repo id ("name" or "org/name")."""
    text = os.fspath(path_or_repo_id)
    return (
        not isinstance(path_or_repo_id, str)
        or Path(text).expanduser().exists()
        or text.startswith((".", "/", "~"))
        or text.count("/") > 1
        or "\\" in text
        or os.sep in text.replace("/", "")
    )


def download(
    repo_id: str,
    revision: str | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    offline: bool = False,
    include_tokenizer: bool = False,
    include_weights: bool = True,
    include_sentence_transformers: bool = False,
    token: str | bool | None = None,
    subfolder: str = "",
) -> Snapshot:
    """Download (or find in the cache) what hfbert loads from `repo_id`, verified; see the module docstring. With
    `subfolder`, the files of the checkpoint in that folder of the repo; `Snapshot.directory` is the repo's root."""
    from huggingface_hub import HfApi, constants

    if offline or constants.HF_HUB_OFFLINE:
        reason = "offline mode was asked for" if offline else "HF_HUB_OFFLINE is set"
        return cached_snapshot(repo_id, revision, cache_dir, reason, token, subfolder)
    try:
        with hub_errors(repo_id, revision):
            info = HfApi(token=token).model_info(repo_id, revision=revision, files_metadata=True)
    except CheckpointError:
        raise
    except Exception as error:  # no network, DNS failure, timeout, server error: fall back to the cache
        reason = f"the Hub is unreachable ({type(error).__name__}: {error})"
        return cached_snapshot(repo_id, revision, cache_dir, reason, token, subfolder)

    siblings = {sibling.rfilename: sibling for sibling in info.siblings or []}
    root = f"{subfolder}/" if subfolder else ""
    inside = [name.removeprefix(root) for name in siblings if name.startswith(root)]  # relative to the checkpoint
    where = f"in folder {subfolder!r} of the repository" if subfolder else "in the repository"
    weight_file = next((name for name in WEIGHT_FILE_PREFERENCE if name in inside), None)
    if weight_file is None and include_weights:
        raise CheckpointNotFoundError(
            f"{repo_id}@{info.sha}: no PyTorch weights {where} (looked for {', '.join(WEIGHT_FILE_PREFERENCE)})"
        )
    wanted = [CONFIG_FILE] if CONFIG_FILE in inside or include_weights else []
    if include_weights:
        wanted.append(weight_file)
    if include_tokenizer:
        wanted += [name for name in TOKENIZER_FILES if name in inside]
    if include_sentence_transformers:
        wanted += sentence_transformers_files(inside) + [name for name in HEAD_LAYER_FILES if name in inside]
    if not wanted:  # nothing to download, so no snapshot folder to hand out
        raise CheckpointNotFoundError(f"{repo_id}@{info.sha}: no {CONFIG_FILE} or tokenizer files {where}")
    snapshot = Snapshot(directory=Path(), commit=info.sha)
    for filename in wanted:
        _fetch(repo_id, root + filename, snapshot, siblings, cache_dir, token)
    if include_weights and weight_file in (SAFETENSORS_INDEX, PICKLE_INDEX):
        index = snapshot.directory / root / weight_file
        for shard in dict.fromkeys(read_shard_index(index, must_exist=False).values()):
            _fetch(repo_id, root + shard.name, snapshot, siblings, cache_dir, token)
    _record_revision(snapshot, revision or "main")
    return snapshot


def _record_revision(snapshot: Snapshot, revision: str) -> None:
    """Point refs/<revision> at the commit, as huggingface_hub does, so offline use of the same revision name
    finds this snapshot. (Files were fetched by sha, so the client did not write the ref itself.)"""
    if revision == snapshot.commit:
        return
    ref = snapshot.directory.parent.parent / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    temporary = ref.with_name(f".{ref.name}.tmp-{os.getpid()}")
    temporary.write_text(snapshot.commit)
    os.replace(temporary, ref)


def _fetch(repo_id: str, filename: str, snapshot: Snapshot, siblings: dict, cache_dir, token=None) -> None:
    from huggingface_hub import hf_hub_download

    sibling = siblings.get(filename)
    if sibling is None:
        raise CheckpointError(f"{repo_id}@{snapshot.commit}: file '{filename}' is named but not in the repository")
    try:
        with hub_errors(repo_id, snapshot.commit):
            local = Path(hf_hub_download(repo_id, filename, revision=snapshot.commit, cache_dir=cache_dir, token=token))
    except CheckpointError:
        raise
    except Exception as error:
        raise CheckpointError(
            f"{repo_id}/{filename}: download failed ({type(error).__name__}: {error}); run the command again to resume"
        ) from None
    # A file in a module folder (1_Pooling/config.json) lies one level deeper than the snapshot root.
    snapshot.directory = local.parents[filename.count("/")]
    snapshot.files.append(filename)
    if sibling.lfs is not None:
        expected = sibling.lfs.sha256
        verify_sha256(local, expected, repo_id, filename)
        snapshot.verified_sha256[filename] = expected


@contextmanager
def hub_errors(repo_id: str, revision: str | None) -> Iterator[None]:
    """Turn huggingface_hub's access errors into one-line CheckpointErrors that say what to do."""
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        yield
    except GatedRepoError:
        raise CheckpointError(
            f"{repo_id}: gated repository; accept its terms on the Hub and log in (`hf auth login` or HF_TOKEN)"
        ) from None
    except RevisionNotFoundError:
        raise CheckpointNotFoundError(f"{repo_id}: revision {revision!r} does not exist") from None
    except RepositoryNotFoundError:
        raise CheckpointNotFoundError(
            f"{repo_id}: no such model repository on {constants.ENDPOINT} (or it is private: log in first)"
        ) from None
    except HFValidationError as error:
        raise CheckpointNotFoundError(f"{repo_id}: neither a local directory nor a valid repo id ({error})") from None


def cached_snapshot(
    repo_id: str, revision: str | None, cache_dir, reason: str, token=None, subfolder: str = ""
) -> Snapshot:
    """The cached snapshot of `repo_id` at `revision`, with no network call; LFS blobs verified by their names (those
    of `subfolder` when given, the checkpoint's folder in the repo)."""
    from huggingface_hub import constants, snapshot_download

    try:
        directory = Path(
            snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, local_files_only=True, token=token)
        )
    except Exception:
        raise CheckpointNotFoundError(  # an OSError too, as transformers' own offline miss
            f"{repo_id}: not found in the Hugging Face cache ({cache_dir or constants.HF_HUB_CACHE}) and {reason}. "
            f"Download it once with network access, or pass a local directory."
        ) from None
    snapshot = Snapshot(directory=directory, commit=directory.name)
    base = directory / subfolder if subfolder else directory
    if not base.is_dir():
        raise CheckpointNotFoundError(f"{repo_id}@{directory.name}: no folder {subfolder!r} in the cached snapshot")
    nested = sentence_transformers_files(
        path.relative_to(base).as_posix() for path in base.glob("*/*") if not path.is_dir()
    )  # the module folders hfbert reads (1_Pooling/, 2_Dense/), not onnx/ or openvino/
    for file in sorted([path for path in base.iterdir() if not path.is_dir()] + [base / n for n in nested]):
        name = file.relative_to(directory).as_posix()
        snapshot.files.append(name)
        # In the cache an LFS file is a link to blobs/<sha256 of its content>: check the content still fits.
        blob_name = Path(os.readlink(file)).name if file.is_symlink() else ""
        if _SHA256.fullmatch(blob_name):
            verify_sha256(file, blob_name, repo_id, name)
            snapshot.verified_sha256[name] = blob_name
    return snapshot


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def verify_sha256(path: Path, expected: str, repo_id: str, filename: str) -> None:
    """Raise CheckpointError unless the content of `path` has sha256 `expected`. A blob of the Hugging Face
    cache that already hashed right and has not changed since (its proof, see the module docstring) is not
    hashed again."""
    blob = path.resolve()
    if _proven(blob, expected):
        return
    before = _fingerprint(blob)
    actual = sha256_of(path)
    if actual != expected:
        raise CheckpointError(
            f"{repo_id}/{filename}: sha256 mismatch: expected {expected}, got {actual} (the file at {blob} is "
            f"corrupted or was altered). Fix: delete {blob} and {path}, then download again."
        )
    if _fingerprint(blob) == before:  # not changed while it was hashed
        _record_proof(blob, expected, before)


PROOF_FOLDER = ".hfbert-verified"


def _proof_path(blob: Path, sha256: str) -> Path | None:
    """Where the proof of a cache blob lies (`<repo>/.hfbert-verified/<sha256>`); None for a file that is not a
    blob of a Hugging Face cache (named by its sha256 in a `blobs` folder)."""
    if blob.parent.name != "blobs" or blob.name != sha256:
        return None
    return blob.parent.parent / PROOF_FOLDER / sha256


def _fingerprint(blob: Path) -> dict[str, int]:
    status = blob.stat()
    return {
        "size": status.st_size,
        "device": status.st_dev,
        "inode": status.st_ino,
        "mtime_ns": status.st_mtime_ns,
        "ctime_ns": status.st_ctime_ns,
    }


def _proven(blob: Path, sha256: str) -> bool:
    proof = _proof_path(blob, sha256)
    if proof is None:
        return False
    try:
        return json.loads(proof.read_text(encoding="utf-8")) == _fingerprint(blob)
    # A proof that cannot be read (bad JSON or UTF-8, nested too deeply) proves nothing: the blob is hashed again
    # and a good proof written over it.
    except (OSError, ValueError, RecursionError):
        return False


def _record_proof(blob: Path, sha256: str, fingerprint: dict[str, int]) -> None:
    """Keep the proof that `blob`, as `fingerprint` describes it, hashed to `sha256`; silently none where the
    cache is read-only."""
    proof = _proof_path(blob, sha256)
    if proof is None:
        return
    try:
        proof.parent.mkdir(exist_ok=True)
        temporary = proof.with_name(f".{proof.name}.tmp-{os.getpid()}")
        temporary.write_text(json.dumps(fingerprint), encoding="utf-8")
        os.replace(temporary, proof)
    except OSError:
        pass


def onnx_external_data(path: Path) -> list[str]:
    """The files an ONNX graph keeps tensors in, as the graph itself names them: the `location` of every tensor
    stored outside it (initializers, constants, sparse tensors, in subgraphs and functions too), relative to the
    graph's folder, in first-use order; whatever they are called (`model.onnx_data`, `weights.bin`, ...). [] for a
    file onnx cannot read: the engine that loads it says why."""
    try:
        import onnx
    except ImportError:
        raise CheckpointError(
            f"{path}: finding the files its external data lies in needs the onnx package: pip install 'hfbert[deploy]'"
        ) from None
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:
        return []
    locations: dict[str, None] = {}
    for tensor in _onnx_tensors(model.graph, model.functions):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location = next((entry.value for entry in tensor.external_data if entry.key == "location"), None)
            if location:
                locations.setdefault(location, None)
    return list(locations)


def _onnx_tensors(graph: Any, functions: Iterable[Any] = ()) -> Iterator[Any]:
    """Every TensorProto of onnx's GraphProto `graph`, its nodes' attributes and subgraphs, and `functions`' nodes."""
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    yield from graph.initializer
    for node in [*graph.node, *(node for function in functions for node in function.node)]:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            sparse_tensors = [*attribute.sparse_tensors]
            if attribute.HasField("sparse_tensor"):
                sparse_tensors.append(attribute.sparse_tensor)
            for sparse in sparse_tensors:
                yield from (sparse.values, sparse.indices)
            for subgraph in [*attribute.graphs, *([attribute.g] if attribute.HasField("g") else [])]:
                yield from _onnx_tensors(subgraph)


def artifact_companions(path: Path) -> list[Path]:
    """The files the artifact file `path` reads beside it: an ONNX graph's external data (`onnx_external_data`: from
    the graph's own locations, not from file names), an OpenVINO IR's `.bin`. Those that exist. Where the graph
    names none (no external data, or a file onnx cannot read), the names exporters give external data
    (`model.onnx_data`, `model.onnx.data`): this list only keeps outputs off files, and those cost nothing to keep."""
    names: list[str] = []
    if path.suffix == ".xml":
        names = [path.with_suffix(".bin").name]
    elif path.suffix == ".onnx":
        names = onnx_external_data(path) or [path.name + "_data", path.name + ".data"]
    return [path.parent / name for name in names if (path.parent / name).is_file()]


def download_artifact(
    repo_id: str,
    path: str,
    revision: str | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
) -> Path:
    """A deployment artifact published inside a model repo (`onnx/model_qint8_avx2.onnx`,
    `openvino/openvino_model.xml`, a CTranslate2 folder), with the files it needs beside it (an ONNX file's external
    data, whatever it is called: the files its graph names; an IR's `.bin`; a folder's every file), downloaded into
    the same cache and checked against the same sha256 as the model's own files. Returns the local path of `path`."""
    from huggingface_hub import HfApi

    path = path.strip("/")
    with hub_errors(repo_id, revision):
        info = HfApi(token=token).model_info(repo_id, revision=revision, files_metadata=True)
    siblings = {sibling.rfilename: sibling for sibling in info.siblings or []}
    wanted = [name for name in siblings if name == path or name.startswith(path + "/")]
    if path.endswith(".xml") and path[: -len(".xml")] + ".bin" in siblings:
        wanted.append(path[: -len(".xml")] + ".bin")
    if not wanted:
        raise CheckpointError(f"{repo_id}@{info.sha}: no file or folder {path!r} in the repository")
    snapshot = Snapshot(directory=Path(), commit=info.sha)
    for filename in sorted(wanted):
        _fetch(repo_id, filename, snapshot, siblings, cache_dir, token)
    if path.endswith(".onnx") and path in siblings:
        # Its external data, named by the graph: known only once the graph is here.
        folder = posixpath.dirname(path)
        for location in onnx_external_data(snapshot.directory / path):
            filename = posixpath.normpath(posixpath.join(folder, location.replace("\\", "/")))
            inside = filename.startswith(f"{folder}/" if folder else "") and ".." not in filename.split("/")
            if posixpath.isabs(location) or not inside:
                raise CheckpointError(
                    f"{repo_id}@{info.sha}: {path} keeps tensors in {location!r}, outside its folder; expected a "
                    f"file beside it"
                )
            if filename not in siblings:
                raise CheckpointError(
                    f"{repo_id}@{info.sha}: {path} keeps tensors in {location!r} ({filename}), which is not in the "
                    f"repository"
                )
            _fetch(repo_id, filename, snapshot, siblings, cache_dir, token)
    return snapshot.directory / path
