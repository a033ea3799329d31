"""A local HTTP server on 127.0.0.1 that answers in JSON (or any bytes): what
the fake model endpoints share, the one stand-in the project allows. A
subclass answers in `post(path, headers, body)` (and `get(path)`), returning
(status, JSON document or bytes[, content type])."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JsonServer:
    http_version = "HTTP/1.0"      # HTTP/1.1: keep-alive, as some clients expect

    def __init__(self):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = outer.http_version

            def log_message(self, *a):
                pass

            def do_HEAD(self):
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self):
                outer._reply(self, *outer.get(self.path))

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {}
                outer._reply(self, *outer.post(self.path, dict(self.headers), body))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @staticmethod
    def _reply(handler: BaseHTTPRequestHandler, status: int, payload,
               content_type: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def get(self, path: str) -> tuple:
        return 404, {"error": "not found"}

    def post(self, path: str, headers: dict, body: dict) -> tuple:
        return 404, {"error": "not found"}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
