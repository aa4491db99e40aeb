"""A web dashboard of DDPJobs, served on this machine with the user's kubeconfig and S3 credentials:
`kubectl ddp dashboard`, or from a notebook

    board = ddp_client.dashboard()      # serves in the background; board.url, board.stop()

It answers only at 127.0.0.1 or localhost, to its own pages, and asks for the token in the URL it gives
(`board.url`; web/access.py says why).

Its pages: every job of a namespace (or of all) updated live; a job's curves, ranks, Events, logs and
results; jobs deleted from the API whose ranks kept something in S3."""

from __future__ import annotations

import asyncio
import html
import threading
from typing import Any
from urllib.parse import urlencode

from ..store import S3Access
from .access import TOKEN_PARAMETER, Access

HOST = "127.0.0.1"  # the user's own machine only: the pages show what the user's credentials can read
PORT = 8265


class RunningDashboard:
    """A dashboard served by a thread of its own until `stop()`."""

    def __init__(self, api_client: Any, s3_access: S3Access, namespace: str | None, port: int,
                 results: tuple[str, ...], access: Access) -> None:
        from .server import DashboardState

        self.state = DashboardState(api_client, s3_access, namespace, results)
        self.access = access
        self._port = port
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._runner: Any = None
        self.address = ""  # http://127.0.0.1:PORT/
        self.url = ""  # the address with its token: what is printed and opened
        self._thread = threading.Thread(target=self._serve, name="ddp-dashboard", daemon=True)

    def start(self) -> RunningDashboard:
        from ..store import load_models

        # S3's model read once now, not in the first answer that needs a job's S3 client (a curve's).
        threading.Thread(target=load_models, name="ddp-dashboard-s3-model", daemon=True).start()
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise self._error
        return self

    def _serve(self) -> None:
        from aiohttp import web

        from .server import application

        asyncio.set_event_loop(self._loop)

        async def begin() -> None:
            self._runner = web.AppRunner(application(self.state, self.access), shutdown_timeout=1.0)
            await self._runner.setup()
            site = web.TCPSite(self._runner, HOST, self._port)
            await site.start()
            port = self._runner.addresses[0][1]
            self.address = f"http://{HOST}:{port}/"
            self.url = self.link()

        try:
            self._loop.run_until_complete(begin())
        except BaseException as error:  # noqa: BLE001 - handed to start(), which raises it
            self._error = error
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
        self._loop.close()

    def link(self, page: str = "", **query: str) -> str:
        """The address of one of its pages ("", "job", "api/job", ...) with the query and its token."""
        if self.access.token is not None:
            query = {**query, TOKEN_PARAMETER: self.access.token}
        return f"{self.address}{page}" + (f"?{urlencode(query)}" if query else "")

    def stop(self) -> None:
        """Closes the open pages' streams, stops serving and ends the watches."""
        if self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
            except TimeoutError:  # a stream that would not end: the loop stops with it
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self.state.stop()

    async def _close(self) -> None:
        """Stops serving, then ends what is left (a page's stream still waiting for a change)."""
        await self._runner.cleanup()
        left = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    def __repr__(self) -> str:
        return f"RunningDashboard({self.url})"

    def _repr_html_(self) -> str:
        url = html.escape(self.url)
        return f'<a href="{url}" target="_blank">DDPJob dashboard: {url}</a>'


def dashboard(namespace: str | None = None, all_namespaces: bool = False, port: int = 0, kubeconfig: str | None = None,
              api_client: Any = None, s3_access: S3Access | None = None, results: tuple[str, ...] = (), *,
              token: bool = True, accept_hosts: tuple[str, ...] = ()) -> RunningDashboard:
    """Serve the dashboard on 127.0.0.1 (`port` 0: a free one) in the background; returns it (its `url`,
    with the token every request needs). `namespace`: the one shown first (default: the kubeconfig
    context's; `all_namespaces`: every one). `results`: results prefixes (spec.s3.results) where jobs
    already deleted are looked for, besides those of the jobs it sees. `token=False` serves without a token
    and `accept_hosts` lets requests for other names in (a proxy in front that you trust and that checks
    who comes: anyone who reaches the port could read then)."""
    from ddp_contract import kubeclient

    from ..submit import default_namespace

    shown = None if all_namespaces else (namespace or default_namespace(kubeconfig))
    client = api_client or kubeclient.api_client(kubeconfig)
    access = Access(hosts=frozenset(accept_hosts)) if token else Access(token=None, hosts=frozenset(accept_hosts))
    return RunningDashboard(client, S3Access.from_env() if s3_access is None else s3_access, shown, port,
                            tuple(results), access).start()
