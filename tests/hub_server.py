"""A Hugging Face hub on 127.0.0.1 for the `ortllm pull hf.co/...` tests: the endpoints huggingface_hub 0.36 uses
(hf_api.model_info, file_download.get_hf_file_metadata and http_get), answered as the hub answers them.

    GET  /api/models/ORG/REPO/revision/REV[?blobs=True]  {"id", "sha", "siblings": [{"rfilename", "size", "blobId",
                                                          "lfs": {"sha256", "size", "pointerSize"}}]}
    HEAD|GET /ORG/REPO/resolve/REV/PATH   X-Repo-Commit; a git file: 200, ETag = its git blob id;
                                          an LFS file (*.gguf, *.safetensors): 302 to /lfs/SHA256 with X-Linked-Etag
                                          (the sha256) and X-Linked-Size, as the hub redirects to its CDN
    HEAD|GET /lfs/SHA256, /files/NAME     the content; Range requests answered 206 (resume, GGUF header reads)
    errors                                404 with X-Error-Code RepoNotFound | RevisionNotFound | EntryNotFound

No Xet headers are sent, so the client downloads over plain HTTP. Faults for the tests, each once:
cut(path, at) drops the connection after `at` bytes of the next full GET of the file; corrupt(path) flips a byte
of it.
`requests` logs every request: (method, path, Range header, status, (first, last) byte sent or None, auth).
"""
from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

LFS_SUFFIXES = (".gguf", ".safetensors")


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    status: int
    sent: tuple[int, int] | None      # the byte span of the file the body carried
    auth: str | None


@dataclass
class FakeHub:
    repos: dict[str, Repo] = field(default_factory=dict)
    plain: dict[str, bytes] = field(default_factory=dict)        # /files/NAME
    requests: list[Request] = field(default_factory=list)
    faults: dict[str, tuple[str, int | None]] = field(default_factory=dict)   # path -> ("cut", at) | ("corrupt", _)

    def add(self, repo_id: str, files: dict[str, bytes]) -> str:
        tree = repo_id + "".join(f"{k}:{git_oid(files[k])}" for k in sorted(files))
        commit = hashlib.sha1(tree.encode()).hexdigest()
        self.repos[repo_id] = Repo(dict(files), commit)
        return commit

    def cut(self, path: str, at: int | None = None) -> None:
        """The next full GET of path ends after `at` bytes (default: half), the connection dropped."""
        self.faults[path] = ("cut", at)

    def corrupt(self, path: str) -> None:
        self.faults[path] = ("corrupt", None)

    def blob(self, sha: str) -> tuple[str, bytes] | None:
        for repo in self.repos.values():
            for path, data in repo.files.items():
                if path.endswith(LFS_SUFFIXES) and hashlib.sha256(data).hexdigest() == sha:
                    return path, data
        return None

    def served(self, path_part: str) -> list[Request]:
        return [r for r in self.requests if path_part in r.path]

    def __enter__(self) -> "FakeHub":
        hub = self

        class Handler(_Handler):
            pass
        Handler.hub = hub
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub

    def log_message(self, *args) -> None:       # the tests read hub.requests instead
        pass

    def do_HEAD(self) -> None:
        self._route(body=False)

    def do_GET(self) -> None:
        self._route(body=True)

    # ------------------------------------------------------------ routing
    def _route(self, body: bool) -> None:
        path = unquote(urlparse(self.path).path)
        m = re.match(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?$", path)
        if m:
            return self._model_info(m.group(1), m.group(2) or "main")
        m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if m:
            return self._resolve(m.group(1), m.group(2), m.group(3), body)
        m = re.match(r"^/lfs/([0-9a-f]{64})$", path)
        if m and (found := self.hub.blob(m.group(1))):       # as the hub's CDN: the name for the progress bar
            disposition = f'attachment; filename="{found[0].rsplit("/", 1)[-1]}";'
            return self._content(found[0], found[1], body, {"ETag": f'"{m.group(1)}"',
                                                             "Content-Disposition": disposition})
        m = re.match(r"^/files/(.+)$", path)
        if m and m.group(1) in self.hub.plain:
            data = self.hub.plain[m.group(1)]
            return self._content(m.group(1), data, body, {"ETag": f'"{hashlib.sha256(data).hexdigest()}"'})
        self._error(404, "EntryNotFound", f"{path} not found")

    def _repo(self, repo_id: str, rev: str) -> Repo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
        elif rev not in ("main", repo.commit):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        else:
            return repo
        return None

    def _model_info(self, repo_id: str, rev: str) -> None:
        repo = self._repo(repo_id, rev)
        if repo is None:
            return
        siblings = []
        for name, data in sorted(repo.files.items()):
            s = {"rfilename": name, "size": len(data), "blobId": git_oid(data)}
            if name.endswith(LFS_SUFFIXES):
                s["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            siblings.append(s)
        info = {"_id": repo.commit[:24], "id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False,
                "disabled": False, "gated": False, "downloads": 0, "likes": 0, "tags": [], "siblings": siblings,
                "lastModified": "2026-11-28T00:00:00.000Z", "createdAt": "2026-11-28T00:00:00.000Z"}
        raw = json.dumps(info).encode()
        self._send(200, {"Content-Type": "application/json", "Content-Length": str(len(raw))}, raw, None)

    def _resolve(self, repo_id: str, rev: str, name: str, body: bool) -> None:
        repo = self._repo(repo_id, rev)
        if repo is None:
            return
        data = repo.files.get(name)
        if data is None:
            return self._error(404, "EntryNotFound", f"{name} does not exist on {rev}", {"X-Repo-Commit": repo.commit})
        if name.endswith(LFS_SUFFIXES):
            sha = hashlib.sha256(data).hexdigest()
            host = self.headers.get("Host")
            self._send(302, {"Location": f"http://{host}/lfs/{sha}", "X-Repo-Commit": repo.commit,
                             "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)),
                             "ETag": f'"{git_oid(b"pointer " + sha.encode())}"', "Content-Length": "0"}, b"", None)
            return
        self._content(name, data, body, {"ETag": f'"{git_oid(data)}"', "X-Repo-Commit": repo.commit})

    # ------------------------------------------------------------ content, with Range and the faults
    def _content(self, name: str, data: bytes, body: bool, headers: dict) -> None:
        first, last, status = 0, len(data) - 1, 200
        rng = self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if not m or int(m.group(1)) >= len(data):
                return self._send(416, {"Content-Range": f"bytes */{len(data)}", "Content-Length": "0"}, b"", None)
            first, last, status = int(m.group(1)), min(int(m.group(2) or len(data) - 1), len(data) - 1), 206
            headers = {**headers, "Content-Range": f"bytes {first}-{last}/{len(data)}"}
        part = data[first:last + 1]
        headers = {**headers, "Content-Length": str(len(part)), "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        fault, at = self.hub.faults.pop(name) if body and not rng and name in self.hub.faults else (None, None)
        if fault == "corrupt":
            part = bytearray(part)
            part[len(part) // 2] ^= 0xFF
            part = bytes(part)
        if fault == "cut":
            half = len(part) // 2 if at is None else at
            self._send(status, headers, part[:half], (first, first + half - 1))
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)      # mid-file: the client sees the body end short
            self.close_connection = True
            return
        self._send(status, headers, part if body else b"", (first, last) if body and part else None)

    def _error(self, status: int, code: str, message: str, extra: dict | None = None) -> None:
        raw = json.dumps({"error": message}).encode()
        self._send(status, {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json",
                            "Content-Length": str(len(raw)), **(extra or {})}, raw, None)

    def _send(self, status: int, headers: dict, raw: bytes, sent: tuple[int, int] | None) -> None:
        self.hub.requests.append(Request(self.command, unquote(urlparse(self.path).path), self.headers.get("Range"),
                                         status, sent, self.headers.get("Authorization")))
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if raw and self.command != "HEAD":
            self.wfile.write(raw)
