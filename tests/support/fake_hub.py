"""A local stand-in for the Hugging Face Hub, good enough for the real `huggingface_hub` (2.x) client.

Implemented (model repos only, anonymous access, plain HTTP: no Xet headers are ever sent):

- `GET /api/models/{repo_id}` and `/api/models/{repo_id}/revision/{revision}` (`HfApi.model_info`, `repo_info`):
  `id`, `modelId`, `sha`, `private`, `gated`, `siblings`; with `?blobs=true` each sibling also has `size`, `blobId`
  and, for LFS files, `lfs: {sha256, size, pointerSize}`.
- `GET /api/models/{repo_id}/tree/{revision}[/{path}]?recursive=...` (`list_repo_tree`, used by `snapshot_download`):
  one page, entries `{type, path, oid, size[, lfs: {oid, size, pointerSize}]}`.
- `HEAD`/`GET /{repo_id}/resolve/{revision}/{filename}` (`hf_hub_download`): small files answer 200 with the bytes,
  `ETag` (git blob sha1) and `X-Repo-Commit`. LFS files (over 10 KB, or weight-file suffixes) answer 302 with
  `Location`, `X-Linked-Etag` (sha256), `X-Linked-Size` and `X-Repo-Commit`.
- `GET /blobs/{sha256}?repo=...&filename=...` on a second port, the "CDN". It must be a different origin: the client
  follows same-origin redirects on its HEAD call and would then look for `X-Repo-Commit` on the blob response;
  redirects to another origin stop there, so the file metadata comes from the 302 itself, as with the real Hub.
- `Range: bytes=N-` / `bytes=N-M` on file bytes (206 + `Content-Range`): the client resumes cut-off downloads so.
- Errors carry `X-Error-Code` / `X-Error-Message`, which `hf_raise_for_status` maps to exceptions: unknown repo ->
  401 `RepoNotFound`; file of a gated repo -> 401 (no token) or 403 (token) `GatedRepo`; unknown revision -> 404
  `RevisionNotFound`; unknown file -> 404 `EntryNotFound` (with `X-Repo-Commit`, which the client caches in
  `.no_exist/`). As on the real Hub, metadata and file lists of a gated repo stay public: only the bytes are refused.

Pointing the client at it: `huggingface_hub.constants` reads `HF_ENDPOINT` at import, so run the client in a
subprocess with `HF_ENDPOINT=hub.url` (and `HF_HUB_DISABLE_XET=1`). In-process, patching `constants.ENDPOINT` is
not enough (`HUGGINGFACE_CO_URL_TEMPLATE`, the `huggingface_hub.model_info` singleton `HfApi` and the known Hub
origins were derived from it at import); pass `endpoint=hub.url` to `HfApi`, `hf_hub_download` and
`snapshot_download` instead.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

_COMMIT = re.compile(r"[0-9a-f]{40}")
_LFS_SUFFIXES = (".safetensors", ".bin", ".h5", ".msgpack", ".ot", ".onnx")
_LFS_THRESHOLD = 10 * 1024
_FLIP = bytes(b ^ 0xFF for b in range(256))  # changes every byte, keeps the length


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class _File:
    data: bytes
    sha256: str
    blob_id: str  # git's id of what git stores: the content itself, or the LFS pointer file
    pointer_size: int | None  # None: stored in git, served by /resolve directly

    @classmethod
    def make(cls, name: str, data: bytes) -> _File:
        sha256 = hashlib.sha256(data).hexdigest()
        if len(data) <= _LFS_THRESHOLD and not name.endswith(_LFS_SUFFIXES):
            return cls(data, sha256, _git_blob_id(data), None)
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len(data)}\n".encode()
        return cls(data, sha256, _git_blob_id(pointer), len(pointer))

    def lfs_fields(self, sha_key: str) -> dict:
        # model_info calls the hash "sha256", the tree listing calls it "oid".
        if self.pointer_size is None:
            return {}
        return {"lfs": {sha_key: self.sha256, "size": len(self.data), "pointerSize": self.pointer_size}}


@dataclass
class _Repo:
    commits: dict[str, dict[str, _File]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    gated: bool = False


class _HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


class FakeHub:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.range_requests: list[tuple[str, str]] = []  # (filename, Range header) of each GET of bytes with one
        self._lock = threading.Lock()
        self._repos: dict[str, _Repo] = {}
        self._blobs: dict[str, bytes] = {}
        self._corrupt: set[tuple[str, str]] = set()
        self._cut_offs: dict[tuple[str, str], list[int]] = {}  # -> [offset, times left]
        self._downloads: list[str] = []
        self._servers = [_Server(self), _Server(self)]  # the Hub, and its "CDN" on another origin
        self._threads: list[threading.Thread] = []
        self.url, self.cdn_url = (f"http://127.0.0.1:{server.server_address[1]}" for server in self._servers)

    # -- test controls --------------------------------------------------------------------------------------------

    def add_revision(self, repo_id: str, sha: str, files: dict[str, bytes], *, branch: str | None = "main") -> None:
        """Add a commit `sha` (40 hex chars) holding `files`; if branch is given, point that branch at it."""
        if not _COMMIT.fullmatch(sha):
            raise ValueError(f"commit sha must be 40 lowercase hex characters, got {sha!r}")
        with self._lock:
            repo = self._repos.setdefault(repo_id, _Repo())
            repo.commits[sha] = {name: _File.make(name, data) for name, data in files.items()}
            self._blobs.update((f.sha256, f.data) for f in repo.commits[sha].values() if f.pointer_size)
            if branch is not None:
                repo.refs[branch] = sha

    def set_gated(self, repo_id: str, gated: bool = True) -> None:
        with self._lock:
            self._repos[repo_id].gated = gated

    def corrupt(self, repo_id: str, filename: str) -> None:
        """From now on serve different bytes (same length) for this file than the sha256 advertised in metadata/ETag."""
        with self._lock:
            self._corrupt.add((repo_id, filename))

    def cut_off_next_download(self, repo_id: str, filename: str, after_bytes: int, *, times: int = 1) -> None:
        """The next GET of this file's bytes sends Content-Length of the full file but closes the connection after
        `after_bytes` bytes. `times` > 1 cuts that many GETs, each at file offset `after_bytes` (a resuming
        `Range: bytes=after_bytes-` request then gets its headers and nothing else); `times=0` cancels.
        The client retries 5 times within the same call, resuming with `Range` from what it had kept: whole 10 MiB
        chunks only (it drops a partial chunk), so for smaller files each retry is a full GET again."""
        with self._lock:
            if times > 0:
                self._cut_offs[(repo_id, filename)] = [after_bytes, times]
            else:
                self._cut_offs.pop((repo_id, filename), None)

    def downloads(self) -> list[str]:
        """Filenames whose bytes were served by a GET (200 or 206, cut off or not), in order."""
        with self._lock:
            return list(self._downloads)

    # -- lifecycle ------------------------------------------------------------------------------------------------

    def start(self) -> FakeHub:
        for server in self._servers:
            thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        for server in self._servers:
            if self._threads:  # shutdown() waits for serve_forever, so only call it once that runs
                server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join()
        self._threads.clear()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- lookups, called from the handler threads -----------------------------------------------------------------

    def _commit(self, repo_id: str, revision: str, *, for_bytes: bool = False, token: bool = False) -> tuple[str, dict]:
        """The commit sha and files of `revision`; `for_bytes`: a file's content is asked for, not metadata."""
        with self._lock:
            repo = self._repos.get(repo_id)
            if repo is None:  # the real Hub answers 401, not 404, so as not to reveal private repos
                raise _HubError(401, "RepoNotFound", "Repository not found")
            if repo.gated and for_bytes:
                message = f"Access to model {repo_id} is restricted. You must have access to it and be authenticated."
                raise _HubError(403 if token else 401, "GatedRepo", message)
            sha = repo.refs.get(revision, revision)
            if sha not in repo.commits:
                raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return sha, repo.commits[sha]

    def _content(self, key: tuple[str, str], data: bytes, range_header: str | None) -> tuple[bytes, int | None]:
        """The bytes to serve for (repo_id, filename) and the file offset to cut the connection at, if any."""
        with self._lock:
            self._downloads.append(key[1])
            if range_header is not None:
                self.range_requests.append((key[1], range_header))
            cut = self._cut_offs.get(key)
            if cut is not None:
                cut[1] -= 1
                if cut[1] <= 0:
                    del self._cut_offs[key]
            return (data.translate(_FLIP) if key in self._corrupt else data), (cut[0] if cut else None)


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # idle keep-alive connections must not block server_close()

    def __init__(self, hub: FakeHub) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hub = hub


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive like the real Hub; every response therefore sends Content-Length
    timeout = 30
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # silence the per-request stderr lines
        pass

    def do_GET(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler's naming
        self._dispatch()

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch()

    def _dispatch(self) -> None:
        hub = self.server.hub
        with hub._lock:
            hub.requests.append((self.command, self.path))
        url = urlsplit(self.path)
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        try:
            if url.path.startswith("/blobs/"):
                sha256 = url.path.removeprefix("/blobs/")
                if sha256 not in hub._blobs:
                    raise _HubError(404, None, "blob not found")
                key = (query.get("repo", ""), query.get("filename", ""))
                self._send_file(key, hub._blobs[sha256], {"ETag": f'"{sha256}"'})
            elif url.path.startswith("/api/models/"):
                self._api(url.path.removeprefix("/api/models/"), query)
            elif "/resolve/" in url.path:
                self._resolve(url.path)
            else:
                raise _HubError(404, None, f"no route for {url.path}")
        except _HubError as error:
            headers = {"Content-Type": "application/json", "X-Error-Message": error.message, **error.headers}
            if error.code:
                headers["X-Error-Code"] = error.code
            self._send(error.status, headers, json.dumps({"error": error.message}).encode())

    def _send(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        self.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _api(self, rest: str, query: dict[str, str]) -> None:
        hub = self.server.hub
        if "/tree/" in rest:
            repo_id, _, tail = rest.partition("/tree/")
            revision, _, folder = (unquote(part) for part in tail.partition("/"))
            sha, files = hub._commit(repo_id, revision)
            entries = _tree(files, folder, recursive=query.get("recursive", "").lower() == "true")
            if folder and not entries:
                raise _HubError(404, "EntryNotFound", f"{folder} does not exist on {revision!r}")
            self._send(200, {"Content-Type": "application/json"}, json.dumps(entries).encode())
            return
        repo_id, _, revision = rest.partition("/revision/")
        sha, files = hub._commit(repo_id, unquote(revision) or "main")
        with_blobs = query.get("blobs", "").lower() == "true"
        siblings = [
            {"rfilename": name, "size": len(f.data), "blobId": f.blob_id, **f.lfs_fields("sha256")}
            if with_blobs
            else {"rfilename": name}
            for name, f in sorted(files.items())
        ]
        info = {
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/")[0] if "/" in repo_id else None,
            "sha": sha,
            "lastModified": "2024-01-01T00:00:00.000Z",
            "createdAt": "2024-01-01T00:00:00.000Z",
            "private": False,
            "gated": "manual" if hub._repos[repo_id].gated else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
        }
        self._send(200, {"Content-Type": "application/json"}, json.dumps(info).encode())

    def _resolve(self, path: str) -> None:
        hub = self.server.hub
        repo_id, _, tail = path.removeprefix("/").partition("/resolve/")
        revision, _, filename = (unquote(part) for part in tail.partition("/"))
        sha, files = hub._commit(repo_id, revision, for_bytes=True, token="Authorization" in self.headers)
        file = files.get(filename)
        if file is None:
            message = f"{filename} does not exist on {revision!r}"
            raise _HubError(404, "EntryNotFound", message, {"X-Repo-Commit": sha})
        headers = {"X-Repo-Commit": sha, "ETag": f'"{file.blob_id}"'}
        if file.pointer_size is None:
            self._send_file((repo_id, filename), file.data, headers)
            return
        location = f"{hub.cdn_url}/blobs/{file.sha256}?{urlencode({'repo': repo_id, 'filename': filename})}"
        headers.update(
            {"Location": location, "X-Linked-Etag": f'"{file.sha256}"', "X-Linked-Size": str(len(file.data))}
        )
        self._send(302, headers, f"Found. Redirecting to {location}".encode())

    def _send_file(self, key: tuple[str, str], data: bytes, headers: dict[str, str]) -> None:
        size, start, status = len(data), 0, 200
        headers = {**headers, "Content-Type": "application/octet-stream", "Accept-Ranges": "bytes"}
        headers["Content-Disposition"] = f'attachment; filename="{key[1].rsplit("/", 1)[-1]}";'
        if "Range" in self.headers:
            match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers["Range"].strip())
            if match is None or int(match[1]) >= size:
                raise _HubError(416, None, "Range Not Satisfiable", {"Content-Range": f"bytes */{size}"})
            start, end = int(match[1]), min(int(match[2] or size - 1), size - 1)
            data, status = data[: end + 1], 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        if self.command == "HEAD":
            self._send(status, headers, data[start:])
            return
        data, cut_at = self.server.hub._content(key, data, self.headers.get("Range"))
        if cut_at is None:
            self._send(status, headers, data[start:])
            return
        # Promise the whole body in Content-Length, send less and close: what a dropped connection looks like.
        self._send(status, {**headers, "Content-Length": str(len(data) - start)}, data[start : max(start, cut_at)])
        self.close_connection = True


def _tree(files: dict[str, _File], folder: str, *, recursive: bool) -> list[dict]:
    """Tree listing entries under `folder`: every file and folder, or only the direct children."""
    prefix = f"{folder}/" if folder else ""
    entries: dict[str, dict] = {}
    for name, file in sorted(files.items()):
        if not name.startswith(prefix):
            continue
        parts = name.removeprefix(prefix).split("/")
        for depth in range(1, len(parts) if recursive else min(2, len(parts))):
            path = prefix + "/".join(parts[:depth])
            entries.setdefault(path, {"type": "directory", "oid": _git_blob_id(path.encode()), "size": 0, "path": path})
        if recursive or len(parts) == 1:
            entries[name] = {"type": "file", "oid": file.blob_id, "size": len(file.data), "path": name}
            entries[name].update(file.lfs_fields("oid"))
    return list(entries.values())
