"""A package registry on the host's loopback for network tests: a PyPI "simple"
index serving a wheel it builds, an npm registry serving a tarball, git's
smart HTTP (git http-backend), and an upload endpoint that keeps what it got."""
from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import os
import subprocess
import tarfile
import threading
import zipfile
from pathlib import Path

WHEEL = "demo_pkg-1.0-py3-none-any.whl"
NPM_PACKAGE = "leftpad-demo"
GIT_HTTP_BACKEND = "/usr/lib/git-core/git-http-backend"


def build_wheel() -> bytes:
    files = {"demo_pkg/__init__.py": b"VALUE = 42\n",
             "demo_pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo-pkg\n"
                                                 b"Version: 1.0\n",
             "demo_pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: caper-tests\n"
                                              b"Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
              for name, data in files.items()]
    files["demo_pkg-1.0.dist-info/RECORD"] = ("\n".join(record + ["demo_pkg-1.0.dist-info/RECORD,,"])
                                              + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


def build_npm_tarball() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, data in (("package/package.json",
                            json.dumps({"name": NPM_PACKAGE, "version": "1.0.0",
                                        "main": "index.js"}).encode()),
                           ("package/index.js", b"module.exports = (s) => ' ' + s;\n")):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def make_git_repo(root: Path) -> None:
    """root/repo.git, a bare repository with one commit holding README."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(root), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@x", "GIT_COMMITTER_NAME": "a",
           "GIT_COMMITTER_EMAIL": "a@x"}
    work = root / "work"
    work.mkdir()
    (work / "README").write_text("from the registry\n")
    for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "README"],
                 ["git", "commit", "-qm", "one"],
                 ["git", "clone", "-q", "--bare", str(work), str(root / "repo.git")]):
        subprocess.run(argv, cwd=work, env=env, check=True, capture_output=True)


class Registry:
    """Serve in a thread; .port, .uploads (bodies POSTed to /upload), .requests."""

    def __init__(self, root: Path):
        self.root = root
        self.wheel = build_wheel()
        self.tarball = build_npm_tarball()
        make_git_repo(root)
        self.uploads: list[bytes] = []
        self.requests: list[tuple[str, str]] = []
        registry = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, status: int, body: bytes, ctype: str = "application/octet-stream"):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_HEAD(self):
                self.do_GET()

            def do_GET(self):
                registry.requests.append((self.command, self.path))
                # Links name the host the client asked for: a name on caper's route too.
                base = f"http://{self.headers.get('Host') or f'127.0.0.1:{registry.port}'}"
                if self.path.startswith("/git/"):
                    return self._git()
                if self.path.rstrip("/") in ("/simple/demo-pkg", "/simple/demo_pkg"):
                    sha = hashlib.sha256(registry.wheel).hexdigest()
                    return self._send(200, f'<html><body><a href="{base}/files/{WHEEL}#sha256='
                                           f'{sha}">{WHEEL}</a></body></html>'.encode(), "text/html")
                if self.path == f"/files/{WHEEL}":
                    return self._send(200, registry.wheel)
                if self.path == f"/npm/{NPM_PACKAGE}":
                    t = registry.tarball
                    doc = {"name": NPM_PACKAGE, "dist-tags": {"latest": "1.0.0"},
                           "versions": {"1.0.0": {
                               "name": NPM_PACKAGE, "version": "1.0.0",
                               "dist": {"tarball": f"{base}/npm/-/{NPM_PACKAGE}-1.0.0.tgz",
                                        "shasum": hashlib.sha1(t).hexdigest(),
                                        "integrity": "sha512-" + base64.b64encode(
                                            hashlib.sha512(t).digest()).decode()}}}}
                    return self._send(200, json.dumps(doc).encode(), "application/json")
                if self.path == f"/npm/-/{NPM_PACKAGE}-1.0.0.tgz":
                    return self._send(200, registry.tarball)
                return self._send(404, b"not here\n", "text/plain")

            def do_POST(self):
                registry.requests.append((self.command, self.path))
                if self.path.startswith("/git/"):
                    return self._git()
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                registry.uploads.append(body)
                return self._send(200, b"stored\n", "text/plain")

            def _git(self):
                path, _, query = self.path[len("/git"):].partition("?")
                body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                env = {"GIT_PROJECT_ROOT": str(registry.root), "GIT_HTTP_EXPORT_ALL": "1",
                       "PATH_INFO": path, "QUERY_STRING": query,
                       "REQUEST_METHOD": self.command,
                       "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                       "CONTENT_LENGTH": str(len(body)), "PATH": "/usr/bin:/bin"}
                p = subprocess.run([GIT_HTTP_BACKEND], input=body, env=env, capture_output=True,
                                   timeout=60)
                head, _, out = p.stdout.partition(b"\r\n\r\n")
                status, headers = 200, []
                for line in head.split(b"\r\n"):
                    k, _, v = line.decode().partition(":")
                    if k.lower() == "status":
                        status = int(v.split()[0])
                    elif k:
                        headers.append((k, v.strip()))
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> "Registry":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


def command_env(home: str) -> dict[str, str]:
    """A plain environment for the command: no proxy of the host's, no caches."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "LC_ALL": "C",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1",
            "GIT_CONFIG_NOSYSTEM": "1"}
