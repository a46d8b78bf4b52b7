"""A fake Hugging Face Hub for offline tests, standard library only.

    python tests/hub_server.py --port 0 --storage DIR [--verbose]

prints one line, ``fake-hub ready at http://127.0.0.1:PORT``, then serves on 127.0.0.1 until SIGTERM or SIGINT.
Point a client at it with ``HF_ENDPOINT=http://127.0.0.1:PORT`` and ``HF_HUB_DISABLE_XET=1`` (both read when
huggingface_hub is imported).

It answers the routes huggingface_hub 2.4 uses for ``create_repo``, ``upload_folder`` / ``create_commit`` (preupload,
NDJSON commit with inline base64 files and LFS pointers, LFS batch API + PUT), ``whoami``, ``model_info``,
``list_repo_tree``, ``get_paths_info``, ``list_repo_refs``, ``list_repo_commits``, and the downloads behind
``hf_hub_download`` / ``snapshot_download`` / ``from_pretrained`` (HEAD and GET ``/{repo}/resolve/{rev}/{path}`` with
``X-Repo-Commit``, ``ETag`` and, for LFS files, ``X-Linked-Etag`` / ``X-Linked-Size``). Errors carry the
``X-Error-Code`` / ``X-Error-Message`` headers the client turns into its exception types (``RepoNotFound``,
``RevisionNotFound``, ``EntryNotFound``).

Authentication: ``Authorization: Bearer <token>`` with one of ``TOKENS``. Reading a public repo needs no token;
every write needs one (401 without, or with an unknown token) whose user may write to the repo's namespace: the user's
own name, or an organization in ``ORGS`` where the user has a write role (403 otherwise). Read-only tokens get 403 on
writes.

Storage (under ``--storage``): ``state.json`` (repos, branches, commits with their full file lists), ``blobs/<git
sha1>`` (regular files), ``lfs/<sha256>`` (LFS objects) and ``requests.jsonl`` (one line per request: method, path,
status, user). ``read_state``, ``repo_files`` and ``requests`` read them back for assertions.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import signal
import sys
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

# token -> (user, role). Roles as on the Hub: "write" may push, "read" may only read.
TOKENS: dict[str, tuple[str, str]] = {
    "hf_fake_alice_write": ("alice", "write"),
    "hf_fake_alice_read": ("alice", "read"),
    "hf_fake_bob_write": ("bob", "write"),
}
# organization -> {member: role in the organization}
ORGS: dict[str, dict[str, str]] = {
    "vaswani-lab": {"alice": "write", "bob": "read"},
}
READY_PREFIX = "fake-hub ready at "

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".onnx", ".msgpack", ".npz", ".npy",
                ".pkl", ".model", ".zip", ".gz", ".tar", ".png", ".jpg", ".parquet", ".arrow")
LFS_MIN_SIZE = 10 * 1024 * 1024
GITATTRIBUTES = "".join(f"*{suffix} filter=lfs diff=lfs merge=lfs -text\n" for suffix in LFS_SUFFIXES).encode()
REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}


# --- reading the storage back (for tests) -----------------------------------------------------------------------

def read_state(storage: str | os.PathLike) -> dict:
    path = Path(storage) / "state.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"repos": {}}


def repo_files(storage: str | os.PathLike, repo_id: str, revision: str = "main", repo_type: str = "model") -> dict:
    """``{path: bytes}`` of a repo at a branch or commit, read from the storage folder."""
    storage = Path(storage)
    repo = read_state(storage)["repos"][f"{repo_type}/{repo_id}"]
    oid = repo["branches"].get(revision, revision)
    files = {}
    for path, entry in repo["commits"][oid]["files"].items():
        blob = storage / "lfs" / entry["lfs"]["oid"] if entry.get("lfs") else storage / "blobs" / entry["oid"]
        files[path] = blob.read_bytes()
    return files


def requests(storage: str | os.PathLike) -> list[dict]:
    """Every request the server answered, oldest first: ``{"method", "path", "status", "user"}``."""
    path = Path(storage) / "requests.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# --- the Hub's state ----------------------------------------------------------------------------------------------

def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class Store:
    """Repos and their commits, kept in memory and mirrored to ``state.json`` after every change."""

    def __init__(self, root: Path):
        self.root = root
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        (root / "lfs").mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        self.state = read_state(root)

    def save(self) -> None:
        tmp = self.root / "state.json.tmp"
        tmp.write_text(json.dumps(self.state, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.root / "state.json")

    def log(self, record: dict) -> None:
        with self.lock, open(self.root / "requests.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    # blobs
    def put_blob(self, data: bytes) -> str:
        oid = git_blob_sha1(data)
        path = self.root / "blobs" / oid
        if not path.exists():
            path.write_bytes(data)
        return oid

    def has_lfs(self, sha256: str) -> bool:
        return (self.root / "lfs" / sha256).is_file()

    def put_lfs(self, sha256: str, data: bytes) -> None:
        if hashlib.sha256(data).hexdigest() != sha256:
            raise HubError(400, f"LFS object {sha256}: the uploaded content does not hash to its oid")
        tmp = self.root / "lfs" / f"{sha256}.tmp{threading.get_ident()}"
        tmp.write_bytes(data)
        os.replace(tmp, self.root / "lfs" / sha256)

    def content(self, entry: dict) -> bytes:
        if entry.get("lfs"):
            return (self.root / "lfs" / entry["lfs"]["oid"]).read_bytes()
        return (self.root / "blobs" / entry["oid"]).read_bytes()

    # repos
    def repo(self, repo_type: str, repo_id: str) -> dict | None:
        return self.state["repos"].get(f"{repo_type}/{repo_id}")

    def create_repo(self, repo_type: str, repo_id: str, private: bool, user: str) -> dict:
        with self.lock:
            oid = self._new_commit_oid(repo_id, "initial commit")
            gitattributes = {"size": len(GITATTRIBUTES), "oid": self.put_blob(GITATTRIBUTES)}
            repo = {
                "id": repo_id, "type": repo_type, "private": bool(private), "created_by": user, "created": now_iso(),
                "branches": {"main": oid},
                "commits": {oid: {"oid": oid, "parent": None, "title": "initial commit", "description": "",
                                  "author": user, "date": now_iso(), "files": {".gitattributes": gitattributes}}},
                "history": [oid],
            }
            self.state["repos"][f"{repo_type}/{repo_id}"] = repo
            self.save()
            return repo

    @staticmethod
    def _new_commit_oid(repo_id: str, title: str) -> str:
        return hashlib.sha1(f"{repo_id}\0{title}\0{time.time_ns()}\0{os.urandom(8).hex()}".encode()).hexdigest()

    def resolve(self, repo: dict, revision: str) -> str:
        revision = unquote(revision)
        if revision in repo["branches"]:
            return repo["branches"][revision]
        if revision.startswith("refs/heads/") and revision[len("refs/heads/"):] in repo["branches"]:
            return repo["branches"][revision[len("refs/heads/"):]]
        if revision in repo["commits"]:
            return revision
        raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    def commit(self, repo: dict, revision: str, header: dict, operations: list[dict], user: str) -> str:
        with self.lock:
            branch = unquote(revision)
            if branch not in repo["branches"]:
                raise HubError(400, f"fake hub: can only commit to an existing branch, not {branch!r}",
                               "RevisionNotFound")
            head = repo["branches"][branch]
            parent = header.get("parentCommit")
            if parent and parent != head and not head.startswith(parent):
                raise HubError(412, f"A commit has happened since. Please refresh and try again. ({parent} != {head})")
            files = dict(repo["commits"][head]["files"])
            for op in operations:
                key, value = op.get("key"), op.get("value") or {}
                path = value.get("path", "")
                if not path or path.startswith("/") or ".." in path.split("/"):
                    raise HubError(400, f"invalid path in commit: {path!r}")
                if key == "file":
                    if value.get("encoding", "base64") != "base64":
                        raise HubError(400, f"unsupported encoding {value.get('encoding')!r}")
                    data = base64.b64decode(value["content"])
                    files[path] = {"size": len(data), "oid": self.put_blob(data)}
                elif key == "lfsFile":
                    sha256 = value["oid"]
                    if not self.has_lfs(sha256):
                        raise HubError(422, f"Your push was rejected because an LFS pointer ({path}) points to a file "
                                            "that does not exist on the server")
                    size = (self.root / "lfs" / sha256).stat().st_size
                    pointer = lfs_pointer(sha256, size)
                    files[path] = {"size": size, "oid": git_blob_sha1(pointer),
                                   "lfs": {"oid": sha256, "size": size, "pointerSize": len(pointer)}}
                elif key == "deletedFile":
                    if path not in files:
                        raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                    del files[path]
                elif key == "deletedFolder":
                    prefix = path.rstrip("/") + "/"
                    for name in [name for name in files if name.startswith(prefix)]:
                        del files[name]
                else:
                    raise HubError(400, f"fake hub: unsupported commit operation {key!r}")
            oid = self._new_commit_oid(repo["id"], header.get("summary", ""))
            repo["commits"][oid] = {"oid": oid, "parent": head, "title": header.get("summary", ""),
                                    "description": header.get("description", ""), "author": user,
                                    "date": now_iso(), "files": files}
            repo["branches"][branch] = oid
            repo["history"].append(oid)
            self.save()
            return oid


# --- HTTP ---------------------------------------------------------------------------------------------------------

API_REPO = r"/api/(?P<type>models|datasets|spaces)/(?P<ns>[^/]+)/(?P<name>[^/]+)"
GIT_REPO = r"/(?:(?P<prefix>datasets|spaces)/)?(?P<ns>[^/]+)/(?P<name>[^/]+?)"
ROUTES = [  # (method, regex, handler name); the first match wins
    ("GET", r"/api/whoami-v2", "whoami"),
    ("POST", r"/api/repos/create", "create_repo"),
    ("POST", r"/api/validate-yaml", "validate_yaml"),
    ("GET", API_REPO + r"(?:/revision/(?P<rev>[^/]+))?", "repo_info"),
    ("POST", API_REPO + r"/preupload/(?P<rev>[^/]+)", "preupload"),
    ("POST", API_REPO + r"/commit/(?P<rev>[^/]+)", "commit"),
    ("GET", API_REPO + r"/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?", "tree"),
    ("POST", API_REPO + r"/paths-info/(?P<rev>[^/]+)", "paths_info"),
    ("GET", API_REPO + r"/refs", "refs"),
    ("GET", API_REPO + r"/commits/(?P<rev>[^/]+)", "commits"),
    ("POST", GIT_REPO + r"\.git/info/lfs/objects/batch", "lfs_batch"),
    ("PUT", r"/_lfs/(?P<oid>[0-9a-f]{64})", "lfs_put"),
    ("HEAD", GIT_REPO + r"/resolve/(?P<rev>[^/]+)/(?P<path>.+)", "resolve"),
    ("GET", GIT_REPO + r"/resolve/(?P<rev>[^/]+)/(?P<path>.+)", "resolve"),
]
COMPILED = [(method, re.compile(pattern + r"/?$"), name) for method, pattern, name in ROUTES]


class Handler(BaseHTTPRequestHandler):
    server_version = "fake-hub/1.0"
    store: Store  # set on the class by make_server
    verbose = False

    # plumbing -------------------------------------------------------------------------------------------------
    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        if self.verbose:
            sys.stderr.write("fake-hub: " + format % args + "\n")

    def do_GET(self):
        self._dispatch("GET")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        self.query = parse_qs(url.query)
        self.status, self.body_read, self.method, self.logged = 500, False, method, False
        self.user, self.role, self.bad_token = self._authenticate()
        try:
            for route_method, regex, name in COMPILED:
                match = regex.match(url.path)
                if match and route_method == method:
                    getattr(self, "route_" + name)(**{k: v for k, v in match.groupdict().items()})
                    break
            else:
                sys.stderr.write(f"fake-hub: no route for {method} {url.path}\n")
                raise HubError(404, f"fake hub: no route for {method} {url.path}")
        except HubError as error:
            self._drain()
            self._error(error)
        except Exception as error:  # a bug in the fake: say so loudly, answer 400 (5xx would be retried)
            import traceback

            traceback.print_exc()
            self._drain()
            self._error(HubError(400, f"fake hub internal error: {type(error).__name__}: {error}"))
        self._log()

    def _log(self) -> None:
        """Record the request once, before its response leaves: a client that has its answer must find the request
        in requests.jsonl (logging after the response raced with tests counting a client's requests)."""
        if not self.logged:
            self.logged = True
            self.store.log({"method": self.method, "path": urlsplit(self.path).path, "status": self.status,
                            "user": self.user})

    def _authenticate(self) -> tuple[str | None, str | None, bool]:
        header = self.headers.get("Authorization", "")
        if not header.lower().startswith("bearer "):
            return None, None, False
        token = header[7:].strip()
        if token in TOKENS:
            user, role = TOKENS[token]
            return user, role, False
        return None, None, True

    def _drain(self) -> None:
        """Read a request body the route refused before reading it, so the client gets the answer, not a reset."""
        if not self.body_read and self.command in ("POST", "PUT"):
            try:
                self._read_body()
            except OSError:
                pass

    def _read_body(self) -> bytes:
        self.body_read = True
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _json_body(self):
        body = self._read_body()
        try:
            return json.loads(body or b"{}")
        except ValueError:
            raise HubError(400, "request body is not JSON") from None

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, content_type="application/json",
              head_only: bool = False, content_length: int | None = None) -> None:
        self.status = status
        self._log()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body) if content_length is None else content_length))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if body and not head_only and self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, obj, status: int = 200, headers: dict | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers)

    def _error(self, error: HubError) -> None:
        headers = {"X-Error-Message": error.message}
        if error.code:
            headers["X-Error-Code"] = error.code
        self._send(error.status, json.dumps({"error": error.message}).encode(), headers)

    @property
    def base_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    # access rules ----------------------------------------------------------------------------------------------
    def _require_token(self) -> str:
        if self.bad_token:
            raise HubError(401, "Invalid credentials in Authorization header")
        if self.user is None:
            raise HubError(401, "Invalid username or password.")
        return self.user

    def _can_write(self, namespace: str) -> bool:
        if self.role != "write":
            return False
        return namespace == self.user or ORGS.get(namespace, {}).get(self.user) in ("admin", "write")

    def _can_read(self, repo: dict) -> bool:
        if not repo["private"]:
            return True
        namespace = repo["id"].split("/")[0]
        return self.user is not None and (namespace == self.user or self.user in ORGS.get(namespace, {}))

    def _repo(self, repo_type: str, ns: str, name: str, write: bool = False) -> dict:
        repo_id = f"{ns}/{name}"
        if write:
            self._require_token()
        repo = self.store.repo(repo_type, repo_id)
        if repo is None or not self._can_read(repo):
            status = 401 if self.user is None else 404
            raise HubError(status, "Repository not found", "RepoNotFound")
        if write and not self._can_write(ns):
            raise HubError(403, f"You don't have the rights to write to {repo_id}: the token's user "
                                f"{self.user!r} ({self.role} token) is not allowed to write to namespace {ns!r}")
        return repo

    @staticmethod
    def _entry_json(path: str, entry: dict) -> dict:
        out = {"type": "file", "oid": entry["oid"], "size": entry["size"], "path": path}
        if entry.get("lfs"):
            out["lfs"] = dict(entry["lfs"])
        return out

    # routes ----------------------------------------------------------------------------------------------------
    def route_whoami(self):
        user = self._require_token()
        orgs = [{"type": "org", "name": org, "fullname": org, "roleInOrg": members[user]}
                for org, members in ORGS.items() if user in members]
        self._json({"type": "user", "id": hashlib.sha1(user.encode()).hexdigest()[:24], "name": user,
                    "fullname": user.title(), "email": f"{user}@example.invalid", "emailVerified": True,
                    "isPro": False, "orgs": orgs,
                    "auth": {"type": "access_token", "accessToken": {"displayName": "fake", "role": self.role}}})

    def route_create_repo(self):
        user = self._require_token()
        payload = self._json_body()
        name, namespace = payload.get("name"), payload.get("organization") or user
        repo_type = payload.get("type") or "model"
        if not name or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}", name):
            raise HubError(400, f"Invalid repo name {name!r}")
        repo_id = f"{namespace}/{name}"
        url = f"{self.base_url}/{URL_PREFIX.get(repo_type, '')}{repo_id}"
        if not self._can_write(namespace):
            raise HubError(403, f'You don\'t have the rights to create a {repo_type} under the namespace "{namespace}"')
        with self.store.lock:
            if self.store.repo(repo_type, repo_id) is not None:
                self._json({"error": "You already created this model repo", "url": url}, status=409)
                return
            private = payload.get("private")
            if private is None:
                private = payload.get("visibility") == "private"
            self.store.create_repo(repo_type, repo_id, private, user)
        self._json({"url": url, "name": repo_id, "id": hashlib.sha1(repo_id.encode()).hexdigest()[:24]})

    def route_validate_yaml(self):
        payload = self._json_body()
        content = payload.get("content", "")
        if content.startswith("---") and "\n---" not in content[3:]:
            self._json({"errors": [{"message": "the metadata block is not closed by a '---' line"}]}, status=400)
            return
        self._json({"errors": [], "warnings": []})

    def route_repo_info(self, type, ns, name, rev=None):  # noqa: A002
        repo = self._repo(REPO_TYPES[type], ns, name)
        oid = self.store.resolve(repo, rev or "main")
        commit = repo["commits"][oid]
        with_blobs = self.query.get("blobs", ["false"])[0].lower() in ("1", "true")
        siblings = []
        for path, entry in sorted(commit["files"].items()):
            sibling = {"rfilename": path}
            if with_blobs:
                sibling.update(size=entry["size"], blobId=entry["oid"])
                if entry.get("lfs"):
                    sibling["lfs"] = {"sha256": entry["lfs"]["oid"], "size": entry["lfs"]["size"],
                                      "pointerSize": entry["lfs"]["pointerSize"]}
            siblings.append(sibling)
        self._json({"_id": hashlib.sha1(repo["id"].encode()).hexdigest()[:24], "id": repo["id"],
                    "modelId": repo["id"], "author": ns, "sha": oid, "lastModified": commit["date"],
                    "createdAt": repo["created"], "private": repo["private"], "disabled": False, "gated": False,
                    "downloads": 0, "likes": 0, "tags": [], "siblings": siblings})

    def route_preupload(self, type, ns, name, rev):  # noqa: A002
        repo = self._repo(REPO_TYPES[type], ns, name, write=True)
        files = repo["commits"][self.store.resolve(repo, rev)]["files"]
        payload = self._json_body()
        answers = []
        for item in payload.get("files", []):
            path, size = item["path"], int(item.get("size", 0))
            sample = base64.b64decode(item.get("sample", ""))
            lfs = size >= LFS_MIN_SIZE or path.endswith(LFS_SUFFIXES) or b"\0" in sample
            existing = files.get(path)
            remote_oid = None
            if existing is not None:
                remote_oid = existing["lfs"]["oid"] if existing.get("lfs") else existing["oid"]
            answers.append({"path": path, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False,
                            "oid": remote_oid})
        self._json({"files": answers, "commitOid": self.store.resolve(repo, rev)})

    def route_commit(self, type, ns, name, rev):  # noqa: A002
        repo = self._repo(REPO_TYPES[type], ns, name, write=True)
        if self.query.get("create_pr", ["0"])[0] in ("1", "true"):
            raise HubError(400, "fake hub: pull requests are not supported")
        lines = [json.loads(line) for line in self._read_body().splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "commit payload must start with a header line")
        oid = self.store.commit(repo, rev, lines[0].get("value") or {}, lines[1:], self.user)
        prefix = URL_PREFIX[repo["type"]]
        url = f"{self.base_url}/{prefix}{repo['id']}/commit/{oid}"
        self._json({"success": True, "commitOid": oid, "commitUrl": url, "hookOutput": ""})

    def _listing(self, files: dict, folder: str, recursive: bool) -> list[dict]:
        prefix = folder.rstrip("/") + "/" if folder else ""
        entries, folders = [], set()
        for path, entry in sorted(files.items()):
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix):]
            parts = rest.split("/")
            for depth in range(1, len(parts)):
                if depth == 1 or recursive:
                    folders.add(prefix + "/".join(parts[:depth]))
            if len(parts) == 1 or recursive:
                entries.append(self._entry_json(path, entry))
        entries += [{"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d}
                    for d in sorted(folders)]
        return entries

    def route_tree(self, type, ns, name, rev, path=None):  # noqa: A002
        repo = self._repo(REPO_TYPES[type], ns, name)
        files = repo["commits"][self.store.resolve(repo, rev)]["files"]
        folder = unquote(path or "").strip("/")
        if folder and not any(p.startswith(folder + "/") for p in files):
            raise HubError(404, f"Entry not found: {folder}", "EntryNotFound")
        recursive = self.query.get("recursive", ["false"])[0].lower() in ("1", "true")
        self._json(self._listing(files, folder, recursive))

    def route_paths_info(self, type, ns, name, rev):  # noqa: A002
        repo = self._repo(REPO_TYPES[type], ns, name)
        files = repo["commits"][self.store.resolve(repo, rev)]["files"]
        body = self._read_body().decode()
        if self.headers.get("Content-Type", "").startswith("application/json"):
            paths = json.loads(body or "{}").get("paths", [])
        else:
            paths = parse_qs(body).get("paths", [])
        out = []
        for path in paths:
            path = path.strip("/")
            if path in files:
                out.append(self._entry_json(path, files[path]))
            elif any(p.startswith(path + "/") for p in files):
                out.append({"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(), "size": 0,
                            "path": path})
        self._json(out)

    def route_refs(self, type, ns, name):  # noqa: A002
        repo = self._repo(REPO_TYPES[type], ns, name)
        branches = [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": oid} for b, oid in repo["branches"].items()]
        self._json({"branches": branches, "converts": [], "tags": [], "pullRequests": []})

    def route_commits(self, type, ns, name, rev):  # noqa: A002
        repo = self._repo(REPO_TYPES[type], ns, name)
        oid, out = self.store.resolve(repo, rev), []
        while oid:
            commit = repo["commits"][oid]
            out.append({"id": oid, "title": commit["title"], "message": commit["description"],
                        "authors": [{"user": commit["author"]}], "date": commit["date"]})
            oid = commit["parent"]
        self._json(out)

    def route_lfs_batch(self, ns, name, prefix=None):
        repo_type = {"datasets": "dataset", "spaces": "space"}.get(prefix, "model")
        self._repo(repo_type, ns, name, write=True)
        payload = self._json_body()
        if payload.get("operation") != "upload":
            raise HubError(400, "fake hub: only LFS uploads are supported")
        objects = []
        for item in payload.get("objects", []):
            oid, size = item["oid"], int(item["size"])
            answer = {"oid": oid, "size": size}
            if not self.store.has_lfs(oid):
                answer.update(authenticated=True, actions={"upload": {"href": f"{self.base_url}/_lfs/{oid}",
                                                                      "expires_in": 3600}})
            objects.append(answer)
        self._send(200, json.dumps({"transfer": "basic", "objects": objects, "hash_algo": "sha256"}).encode(),
                   content_type="application/vnd.git-lfs+json")

    def route_lfs_put(self, oid):
        self.store.put_lfs(oid, self._read_body())
        self._send(200)

    def route_resolve(self, ns, name, rev, path, prefix=None):
        repo_type = {"datasets": "dataset", "spaces": "space"}.get(prefix, "model")
        repo = self._repo(repo_type, ns, name)
        oid = self.store.resolve(repo, rev)
        path = unquote(path)
        entry = repo["commits"][oid]["files"].get(path)
        if entry is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound")
        headers = {"X-Repo-Commit": oid, "Accept-Ranges": "bytes", "ETag": f'"{entry["oid"]}"'}
        if entry.get("lfs"):
            headers.update({"ETag": f'"{entry["lfs"]["oid"]}"', "X-Linked-Etag": f'"{entry["lfs"]["oid"]}"',
                            "X-Linked-Size": str(entry["lfs"]["size"])})
        if self.command == "HEAD":
            self._send(200, headers=headers, content_type="application/octet-stream", content_length=entry["size"])
            return
        data = self.store.content(entry)
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if match:
            start = int(match.group(1))
            end = int(match.group(2)) if match.group(2) else len(data) - 1
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            self._send(206, data[start:end + 1], headers, content_type="application/octet-stream")
            return
        self._send(200, data, headers, content_type="application/octet-stream")


def make_server(port: int, storage: str | os.PathLike, verbose: bool = False) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"store": Store(Path(storage)), "verbose": verbose})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A fake Hugging Face Hub on 127.0.0.1, for offline tests.")
    parser.add_argument("--port", type=int, default=0, help="0 lets the OS choose a free port")
    parser.add_argument("--storage", required=True, help="folder for repos, blobs and the request log")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = parser.parse_args(argv)
    server = make_server(args.port, args.storage, args.verbose)

    def stop(*_):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"{READY_PREFIX}http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["TOKENS", "ORGS", "READY_PREFIX", "make_server", "read_state", "repo_files", "requests"]
