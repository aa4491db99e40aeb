"""The operator's HTTP endpoint, on a thread of its own: /metrics for Prometheus, /healthz for the kubelet.

It serves from the process's start, a standby's included (kopf's own liveness endpoint only starts
once this process leads). /healthz answers 200 while every registered check passes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, make_wsgi_app

log = logging.getLogger(__name__)
METRICS_PATH = "/metrics"
HEALTH_PATH = "/healthz"
Check = Callable[[], bool]


class Health:
    """Named checks; healthy while all pass (a check that raises fails)."""

    def __init__(self) -> None:
        self._checks: dict[str, Check] = {}

    def add(self, name: str, check: Check) -> None:
        self._checks[name] = check

    def failing(self) -> list[str]:
        return [name for name, check in list(self._checks.items()) if not _passes(check)]


def _passes(check: Check) -> bool:
    try:
        return bool(check())
    except Exception:  # noqa: BLE001 - a check that breaks is a failing check
        return False


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes and probes every few seconds are not news."""


def application(health: Health) -> Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]:
    metrics_app = make_wsgi_app(REGISTRY)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == METRICS_PATH:
            return metrics_app(environ, start_response)
        if path == HEALTH_PATH:
            failing = health.failing()
            start_response("500 Internal Server Error" if failing else "200 OK", [("Content-Type", "text/plain")])
            return [(f"failing: {', '.join(failing)}\n" if failing else "ok\n").encode()]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics or /healthz\n"]

    return app


class Endpoint:
    def __init__(self, address: str, port: int, health: Health) -> None:
        self._server = make_server(address, port, application(health), server_class=_Server, handler_class=_QuietHandler)
        self.port = int(self._server.server_port)
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
