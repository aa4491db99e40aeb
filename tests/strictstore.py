"""An S3 store as those that predate AWS's 2025 checksum defaults behave, in front of a real S3 server:
an HTTP proxy on loopback that refuses what MinIO before 2025, Ceph RGW, Backblaze B2 and Google Cloud
Storage's XML API refuse, and forwards everything else untouched.

Refused, with the S3 error those stores answer:
- a request carrying a flexible checksum (`x-amz-checksum-*`, `x-amz-sdk-checksum-algorithm`,
  `x-amz-trailer`): 400 InvalidArgument, "Unsupported header" (B2's and GCS's words);
- an aws-chunked body (`Content-Encoding: aws-chunked`, a `STREAMING-*` payload hash): 400
  XAmzContentSHA256Mismatch;
- DeleteObjects without Content-MD5: 400 InvalidRequest, "Missing required header for this request:
  Content-MD5" (what S3's API required until then).
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

FLEXIBLE_CHECKSUM_HEADERS = ("x-amz-checksum-", "x-amz-sdk-checksum-algorithm", "x-amz-trailer")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


def refusal(method: str, query: str, headers: dict[str, str]) -> tuple[str, str] | None:
    """(S3 error code, message) for a request such a store refuses; None for one it takes."""
    for name in headers:
        if name.startswith(FLEXIBLE_CHECKSUM_HEADERS):
            return "InvalidArgument", f"Unsupported header '{name}' received for this API call."
    if "aws-chunked" in headers.get("content-encoding", "") or \
            headers.get("x-amz-content-sha256", "").startswith("STREAMING-"):
        return "XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' header does not match what was computed."
    if method == "POST" and "delete" in query.split("&") and "content-md5" not in headers:
        return "InvalidRequest", "Missing required header for this request: Content-MD5"
    return None


class StrictStore:
    """The proxy's state: where it forwards to, and every refusal it answered (method, path, code)."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.refused: list[tuple[str, str, str]] = []
        self.forwarded = 0
        self.paths: list[tuple[str, str]] = []  # (method, path?query) of each forwarded request
        self.lock = threading.Lock()


def _handler(store: StrictStore) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _handle(self) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            if "chunked" in headers.get("transfer-encoding", ""):
                self._error(501, "NotImplemented", "Transfer-Encoding: chunked is not supported.")
                return
            body = self.rfile.read(int(headers.get("content-length", "0") or 0))
            path, _, query = self.path.partition("?")
            refused = refusal(self.command, query, headers)
            if refused is not None:
                with store.lock:
                    store.refused.append((self.command, self.path, refused[0]))
                self._error(400, *refused)
                return
            upstream = http.client.HTTPConnection(*store.upstream, timeout=120)
            try:
                upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():  # the Host the client signed goes on as it is
                    if name.lower() not in HOP_BY_HOP:
                        upstream.putheader(name, value)
                upstream.endheaders(body)
                response = upstream.getresponse()
                data = response.read()
            finally:
                upstream.close()
            with store.lock:
                store.forwarded += 1
                store.paths.append((self.command, self.path))
            self.send_response_only(response.status, response.reason)
            for name, value in response.getheaders():  # a HEAD's Content-Length is the object's: kept
                if name.lower() not in HOP_BY_HOP and (name.lower() != "content-length" or self.command == "HEAD"):
                    self.send_header(name, value)
            if self.command != "HEAD":
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _error(self, status: int, code: str, message: str) -> None:
            body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}'
                    f"</Message></Error>").encode()
            self.send_response_only(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

    return Handler


@contextmanager
def strict_store(upstream: str) -> Iterator[tuple[str, StrictStore]]:
    """The strict store on a free loopback port in front of `upstream`; yields (its endpoint, its state)."""
    store = StrictStore(upstream)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(store))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="strict-store", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", store
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
