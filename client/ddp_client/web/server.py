"""The dashboard's web server (aiohttp), on the user's own machine: pages and their JSON, read with the
user's kubeconfig and S3 credentials, so it shows nothing the user could not read already and says the
API server's refusal where it refuses.

    GET /                          the jobs of the namespace (or all): a row each, live (Server-Sent Events)
    GET /job?namespace=&name=      a job's page
    GET /api/jobs/events?namespace=            the rows, sent again at each change (SSE; `all` for every namespace)
    GET /api/deleted?namespace=                jobs gone from the API whose ranks kept something in S3
    GET /api/job?namespace=&name=[&results=]   status, ranks, data workers, Events (views.job_page)
    GET /api/metrics?...&rank=0|all|each&axis=step|time   curves (bounded points) and the attempts' marks
    GET /api/logs?...&rank=&attempt=&end=      a page of a rank's log, from its pod or from S3
    GET /api/files?...                         results and kept files; /api/download?...&path= one of them

Every request must name this machine's address as its Host, come from the dashboard's own pages and carry
the token of the printed URL (access.py); the first page opened with ?token= leaves it in a cookie.
"""

from __future__ import annotations

import asyncio
import json
import mimetypes
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from ddp_contract import layout
from ddp_contract.jobspec import S3Spec

from ..job import Job
from ..metriccolumns import Columns
from ..store import S3Access, StoreError
from . import views
from .access import TOKEN_PARAMETER, Access, given_token, token_cookie
from .reading import JobsWatch, Reader, api_error_text, kept_job_names

STATIC = Path(__file__).parent / "static"
ALL = "all"  # the namespace parameter for every namespace; the rank parameter for the mean of every rank
EACH = "each"  # the rank parameter for every rank's curve side by side
SEND_EVERY_SECONDS = 0.5  # the jobs' rows are sent at most this often
T = TypeVar("T")


class Feed:
    """One namespace's JobsWatch and the changes it saw, counted on the server's event loop."""

    def __init__(self, api_client: Any, namespace: str | None, loop: asyncio.AbstractEventLoop) -> None:
        self.watch = JobsWatch(api_client, namespace, self._changed_in_thread)
        self.version = 0
        self._loop = loop
        self._changed = asyncio.Event()

    def _changed_in_thread(self) -> None:
        self._loop.call_soon_threadsafe(self.bump)

    def bump(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed_since(self, version: int) -> None:
        if self.version == version:
            await self._changed.wait()


class DashboardState:
    """The server's state: the feeds of the namespaces asked for, the job handles, where deleted jobs are looked for."""

    def __init__(self, api_client: Any, s3_access: S3Access, namespace: str | None, results: tuple[str, ...] = ()) -> None:
        self.api_client = api_client
        self.reader = Reader(api_client, s3_access)
        self.s3_access = s3_access
        self.namespace = namespace  # the one shown first (None: every namespace)
        # Results URIs where deleted jobs are looked for -> a job that has it, as last seen (its S3 settings read
        # it, also once it is deleted), or None for one given (read with the given settings).
        self.results: dict[str, dict[str, Any] | None] = dict.fromkeys(results)
        self._access: dict[str, S3Access] = {}
        # (namespace, name, results, rank (or EACH), axis) -> (records drawn from, curves, each rank's newest record)
        self.curves: dict[tuple[str, str, str | None, int | str | None, str],
                          tuple[int, dict[str, Any], dict[int, dict[str, Any]]]] = {}
        self.feeds: dict[str | None, Feed] = {}

    def feed(self, namespace: str | None) -> Feed:
        if namespace not in self.feeds:
            self.feeds[namespace] = Feed(self.api_client, namespace, asyncio.get_running_loop())
            self.feeds[namespace].watch.start()
        return self.feeds[namespace]

    def stop(self) -> None:
        for feed in self.feeds.values():
            feed.watch.stop()

    def access(self, results: str) -> S3Access:
        """The S3 settings that read `results`: a job's own that has it (endpoint, Secret), else those given."""
        if results not in self._access:
            holder = self.results.get(results)
            self._access[results] = self.s3_access if holder is None else Job(
                holder["metadata"]["name"], holder["metadata"]["namespace"], self.api_client, self.s3_access,
                seen=holder).store().access
        return self._access[results]

    def job(self, namespace: str, name: str, results: str | None) -> Job:
        """The handle on a job; a deleted one's (`results` given) reads S3 as its siblings' do."""
        return self.reader.job(namespace, name, results, self.access(results) if results else None)

    def rows(self, feed: Feed) -> dict[str, Any]:
        jobs = list(feed.watch.jobs.values())
        for job in jobs:  # where their deleted siblings are looked for
            results = S3Spec.from_spec((job.get("spec") or {}).get("s3")).results
            if results and self.results.get(results) is None:
                self.results[results] = job
        rows = sorted((views.job_row(job) for job in jobs), key=lambda r: (r["namespace"], r["name"]))
        return {"jobs": rows, "error": feed.watch.error}


STATE: web.AppKey[DashboardState] = web.AppKey("dashboard", DashboardState)
ACCESS: web.AppKey[Access] = web.AppKey("access", Access)
TOKEN_IN_QUERY = "ddp.token-in-query"  # a request whose token came in its query: the answer sets the cookie


def _served_port(request: web.Request) -> int:
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    return int(sockname[1]) if sockname else 0


def _refused(request: web.Request, why: str) -> web.Response:
    """403 with the reason: JSON for the API (the pages show its "error"), text for a page."""
    if request.path.startswith("/api/"):
        return _json({"error": why}, 403)
    return web.Response(status=403, text=f"403 Forbidden: {why}\n", content_type="text/plain")


@web.middleware
async def guard(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                ) -> web.StreamResponse:
    """Refuses a foreign Host, a script of another origin and a request without the token (access.py)."""
    access, port = request.app[ACCESS], _served_port(request)
    host = request.headers.get("Host")
    token = given_token(request.query, request.headers, request.cookies, port)
    why = (access.host_refusal(host, port) or access.origin_refusal(request.headers, host)
           or access.token_refusal(token))
    if why is not None:
        return _refused(request, why)
    request[TOKEN_IN_QUERY] = access.token is not None and TOKEN_PARAMETER in request.query
    return await handler(request)


async def _headers(request: web.Request, response: web.StreamResponse) -> None:
    """Keeps the token of an opened address in a cookie for the page's own requests; no page of another site
    may frame the dashboard's, or learn its address (and token) from a Referer."""
    if request.get(TOKEN_IN_QUERY):  # a header of its own: aiohttp has written the response's cookies by now
        response.headers.add("Set-Cookie", token_cookie(_served_port(request), request.query[TOKEN_PARAMETER]))
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "no-referrer"


def _scope(request: web.Request, dashboard: DashboardState) -> str | None:
    namespace = request.query.get("namespace", dashboard.namespace or ALL)
    return None if namespace == ALL else namespace


def _job_args(request: web.Request) -> tuple[str, str, str | None]:
    try:
        return request.query["namespace"], request.query["name"], request.query.get("results") or None
    except KeyError as missing:
        raise web.HTTPBadRequest(text=f"the query needs {missing.args[0]}") from None


async def _job_request(request: web.Request) -> tuple[DashboardState, tuple[str, str, str | None], Job]:
    """The server's state, the job the query names (namespace, name, results URI) and its handle."""
    dashboard = request.app[STATE]
    args = _job_args(request)
    return dashboard, args, await _blocking(lambda: dashboard.job(*args))


def _int(request: web.Request, name: str, default: int | None) -> int | None:
    value = request.query.get(name)
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name}={value!r} is not a whole number") from None


async def _blocking(call: Callable[[], T]) -> T:
    return await asyncio.get_running_loop().run_in_executor(None, call)


def _json(body: Any, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=partial(json.dumps, default=str))


def _answering(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
               ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The API server's refusal or an S3 error as JSON the page shows ({"error": ...}), with the API's status."""
    async def answer(request: web.Request) -> web.StreamResponse:
        from kubernetes.client.rest import ApiException

        try:
            return await handler(request)
        except ApiException as error:
            return _json({"error": f"the Kubernetes API answered {api_error_text(error)}"}, error.status or 502)
        except StoreError as error:
            return _json({"error": f"S3: {error}"}, 502)
        except LookupError as error:
            return _json({"error": str(error)}, 404)
    return answer


async def page(name: str, request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC / name)


async def static(request: web.Request) -> web.StreamResponse:
    path = (STATIC / request.match_info["file"]).resolve()
    if STATIC.resolve() not in path.parents or not path.is_file():
        raise web.HTTPNotFound()
    return web.FileResponse(path)


async def job_events(request: web.Request) -> web.StreamResponse:
    """The jobs' rows now, then again after each change (at most every SEND_EVERY_SECONDS)."""
    dashboard: DashboardState = request.app[STATE]
    feed = dashboard.feed(_scope(request, dashboard))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    await _blocking(lambda: feed.watch.listed.wait(30))
    sent = -1
    try:
        while True:
            if feed.version != sent:
                sent = feed.version
                await response.write(f"data: {json.dumps(dashboard.rows(feed), default=str)}\n\n".encode())
                await asyncio.sleep(SEND_EVERY_SECONDS)
            else:
                await feed.changed_since(sent)
    except ConnectionResetError:  # the page was closed
        pass
    return response


@_answering
async def deleted(request: web.Request) -> web.StreamResponse:
    """Jobs of the namespace that kept something in S3 under a results prefix seen (or given), gone from the API."""
    dashboard: DashboardState = request.app[STATE]
    namespace = _scope(request, dashboard)
    live = set(dashboard.feed(namespace).watch.jobs)
    rows, errors = [], []
    for results in list(dashboard.results):
        try:
            found = await _blocking(lambda: kept_job_names(dashboard.access(results), results, namespace))
        except StoreError as error:
            errors.append(str(error))
            continue
        rows += [views.deleted_row(space, name, results) for space, name in found if (space, name) not in live]
    return _json({"jobs": rows, "errors": errors})


@_answering
async def job(request: web.Request) -> web.StreamResponse:
    dashboard, (namespace, name, results), handle = await _job_request(request)

    def read() -> dict[str, Any]:
        try:
            body = handle.get()
        except LookupError:
            if results is None:
                raise
            return {"job": views.deleted_row(namespace, name, results), "deleted": True,
                    "attempts": sorted(handle.kept_attempts())}
        pods, workers = dashboard.reader.pods(namespace, name)
        events = dashboard.reader.events(namespace, name, [p["metadata"]["name"] for p in pods + workers])
        return {**views.job_page(body, pods, events, workers), "deleted": False}
    return _json(await _blocking(read))


@_answering
async def metrics(request: web.Request) -> web.StreamResponse:
    dashboard, (namespace, name, results), handle = await _job_request(request)
    each = request.query.get("rank") == EACH
    rank = None if request.query.get("rank") in (ALL, EACH) else _int(request, "rank", 0)
    axis = "step" if each else request.query.get("axis", "step")

    def read_events() -> list[dict[str, Any]]:
        from kubernetes.client.rest import ApiException

        try:
            return dashboard.reader.events(namespace, name) if results is None else []
        except ApiException:  # the marks go without their reasons where Events cannot be read
            return []

    def read() -> dict[str, Any]:
        with ThreadPoolExecutor(1) as beside:  # the API server answers while the records are read and drawn
            events = beside.submit(read_events)
            # Columns: the records' fields read once for the curves, the newest steps and the marks.
            records, causes, resumed = Columns(handle.metrics()), handle.attempt_causes(), handle.attempt_recoveries()
            # Drawn again only once more records came.
            key = (namespace, name, results, EACH if each else rank, axis)
            drawn = dashboard.curves.get(key)
            if drawn is None or drawn[0] != len(records):
                curves = views.curves_by_rank(records) if each else views.curves(records, rank, axis)
                drawn = dashboard.curves[key] = (len(records), curves, views.last_steps(records))
            return {"curves": drawn[1], "marks": views.attempt_marks(records, views.event_rows(events.result()), causes, resumed),
                    "ranks": sorted(drawn[2]), "lastSteps": drawn[2]}
    return _json(await _blocking(read))


@_answering
async def logs(request: web.Request) -> web.StreamResponse:
    _, _, handle = await _job_request(request)
    rank = _int(request, "rank", 0) or 0
    attempt, end = _int(request, "attempt", None), _int(request, "end", None)

    def read() -> dict[str, Any]:
        shown, texts = handle.log_texts(attempt, rank)
        attempts = sorted(set(handle.kept_attempts()) | ({shown} if shown is not None else set()))
        return {**views.log_page(texts.get(rank, ""), end), "attempt": shown, "rank": rank, "attempts": attempts}
    return _json(await _blocking(read))


@_answering
async def files(request: web.Request) -> web.StreamResponse:
    _, _, handle = await _job_request(request)

    def read() -> dict[str, Any]:
        found = [{"path": f"{layout.RESULTS}/{f.path}", "size": f.size} for f in handle.results()]
        found += [{"path": f"{layout.KEPT}/{f.path}", "size": f.size} for f in handle.kept()]
        return {"files": found}
    return _json(await _blocking(read))


@_answering
async def download(request: web.Request) -> web.StreamResponse:
    _, _, handle = await _job_request(request)
    path = request.query.get("path", "")
    if path.partition("/")[0] not in (layout.RESULTS, layout.KEPT) or not layout.is_result_path(path):
        raise web.HTTPBadRequest(text=f"{path!r} is not a path of the job's results/ or kept/")
    body = await _blocking(lambda: handle.store().get(path))
    filename = path.rsplit("/", 1)[-1]
    return web.Response(body=body, content_type=mimetypes.guess_type(filename)[0] or "application/octet-stream",
                        headers={"Content-Disposition": f'attachment; filename="{filename}"'})


async def config(request: web.Request) -> web.StreamResponse:
    dashboard: DashboardState = request.app[STATE]
    return _json({"namespace": dashboard.namespace or ALL})


def application(dashboard: DashboardState, access: Access | None = None) -> web.Application:
    """The dashboard's app; `access` says what a request must bring (default: a new token, loopback names)."""
    app = web.Application(middlewares=[guard])
    app[STATE] = dashboard
    app[ACCESS] = access or Access()
    app.on_response_prepare.append(_headers)
    app.router.add_get("/", partial(page, "index.html"))
    app.router.add_get("/job", partial(page, "job.html"))
    app.router.add_get("/static/{file}", static)
    app.router.add_get("/api/config", config)
    app.router.add_get("/api/jobs/events", job_events)
    app.router.add_get("/api/deleted", deleted)
    app.router.add_get("/api/job", job)
    app.router.add_get("/api/metrics", metrics)
    app.router.add_get("/api/logs", logs)
    app.router.add_get("/api/files", files)
    app.router.add_get("/api/download", download)

    async def stop_watches(app: web.Application) -> None:
        dashboard.stop()
    app.on_shutdown.append(stop_watches)
    return app
