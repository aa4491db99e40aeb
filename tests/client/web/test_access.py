"""Who may read the dashboard (ddp_client.web.access): the rules, then raw HTTP requests against a served
dashboard on loopback, each refused or answered as a browser would be (the browser's own tests are in
tests/e2e/test_dashboard.py)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from kubernetes import client

import ddp_client
from ddp_client.store import S3Access
from ddp_client.web.access import Access, cookie_name, given_token, split_host

PORT = 8265


@pytest.mark.parametrize("host", ["127.0.0.1:8265", "localhost:8265", "LOCALHOST:8265", "[::1]:8265"])
def test_loopback_names_at_the_served_port_are_let_in(host: str) -> None:
    assert Access().host_refusal(host, PORT) is None


@pytest.mark.parametrize("host", ["evil.example:8265", "127.0.0.1:9999", "localhost", "127.0.0.1.evil.example:8265",
                                  "", None, "localhost:port", "10.0.0.1:8265"])
def test_other_hosts_are_refused_naming_the_address_that_answers(host: str | None) -> None:
    why = Access().host_refusal(host, PORT)
    assert why is not None and "127.0.0.1:8265 or localhost:8265" in why and "DNS rebinding" in why


def test_a_name_accepted_for_a_proxy_is_let_in_with_any_port() -> None:
    access = Access(hosts=frozenset({"Board.Example"}))
    assert access.host_refusal("board.example", PORT) is None
    assert access.host_refusal("board.example:443", PORT) is None
    assert access.host_refusal("other.example", PORT) is not None


def test_port_80_may_be_left_out_of_the_host() -> None:
    assert Access().host_refusal("localhost", 80) is None


def test_only_the_dashboard_s_own_origin_is_let_in() -> None:
    access = Access()
    assert access.origin_refusal({}, "127.0.0.1:8265") is None  # a page's own GETs carry no Origin
    assert access.origin_refusal({"Origin": "http://127.0.0.1:8265"}, "127.0.0.1:8265") is None
    for origin in ("http://evil.example", "http://127.0.0.1:9999", "null", "http://localhost:8265"):
        why = access.origin_refusal({"Origin": origin}, "127.0.0.1:8265")
        assert why is not None and repr(origin) in why


@pytest.mark.parametrize(("site", "mode", "dest", "refused"), [
    ("same-origin", "cors", "empty", False),  # the page's own fetch
    ("none", "navigate", "document", False),  # the address typed or opened from a terminal
    ("cross-site", "navigate", "document", False),  # a link from a notebook: a page opened for the user
    ("cross-site", "no-cors", "empty", True),  # another site's script, even without an Origin header
    ("same-site", "no-cors", "image", True),  # another port of this machine: another origin of the same site
    ("cross-site", "navigate", "iframe", True),  # framed by another site
])
def test_requests_other_sites_start_are_refused_but_opening_a_page(site: str, mode: str, dest: str,
                                                                  refused: bool) -> None:
    why = Access().origin_refusal({"Sec-Fetch-Site": site, "Sec-Fetch-Mode": mode, "Sec-Fetch-Dest": dest},
                                  "127.0.0.1:8265")
    assert (why is not None) == refused and (why is None or f"Sec-Fetch-Site: {site}" in why)


def test_the_token_must_be_the_dashboard_s_own() -> None:
    access = Access(token="right")
    assert access.token_refusal("right") is None
    assert "carries no token" in (access.token_refusal(None) or "")
    assert "carries a wrong token" in (access.token_refusal("wrong") or "")
    assert Access(token=None).token_refusal(None) is None


def test_the_token_comes_from_the_query_the_authorization_header_or_the_cookie() -> None:
    assert given_token({"token": "q"}, {"Authorization": "token h"}, {cookie_name(PORT): "c"}, PORT) == "q"
    assert given_token({}, {"Authorization": "token h"}, {cookie_name(PORT): "c"}, PORT) == "h"
    assert given_token({}, {"Authorization": "Bearer b"}, {}, PORT) == "b"
    assert given_token({}, {"Authorization": "Basic x"}, {cookie_name(PORT): "c"}, PORT) == "c"
    assert given_token({}, {}, {cookie_name(PORT + 1): "other dashboard's"}, PORT) is None


def test_split_host() -> None:
    assert split_host("[::1]:8265") == ("::1", 8265)
    assert split_host("Localhost") == ("localhost", None)
    assert split_host("a:b") == ("a:b", -1)


@pytest.fixture
def board() -> Iterator[ddp_client.web.RunningDashboard]:
    """A dashboard on loopback; the requests here are refused or answered before any call to the API server."""
    running = ddp_client.dashboard("ns", api_client=client.ApiClient(), s3_access=S3Access())
    yield running
    running.stop()


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    """A raw GET: the Host (and every other header) is what the caller says, as a rebinding page's would be."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        connection.putrequest("GET", path, skip_host="Host" in (headers or {}))
        for name, value in (headers or {}).items():
            connection.putheader(name, value)
        connection.endheaders()
        answer = connection.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read().decode()
    finally:
        connection.close()


def test_the_printed_url_opens_the_page_and_leaves_the_token_in_a_cookie(board: ddp_client.web.RunningDashboard
                                                                         ) -> None:
    status, headers, body = get(board.url)
    assert status == 200 and "<html" in body.lower()
    cookie = headers["Set-Cookie"]
    port = urlsplit(board.url).port or 0
    assert cookie.startswith(f"{cookie_name(port)}={board.access.token};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert headers["X-Frame-Options"] == "DENY" and headers["Referrer-Policy"] == "no-referrer"
    status, _, body = get(f"{board.address}api/config", {"Cookie": cookie.split(";")[0]})
    assert (status, json.loads(body)) == (200, {"namespace": "ns"})
    status, _, body = get(f"{board.address}api/config", {"Authorization": f"token {board.access.token}"})
    assert status == 200


@pytest.mark.parametrize("path", ["", "job", "static/common.js", "api/config", "api/jobs/events", "api/job",
                                  "api/logs", "api/files", "api/download"])
def test_a_request_without_the_token_is_refused_saying_how_to_pass_it(
        board: ddp_client.web.RunningDashboard, path: str) -> None:
    status, headers, body = get(f"{board.address}{path}?namespace=ns&name=a")
    assert status == 403
    said = json.loads(body)["error"] if path.startswith("api/") else body
    assert "needs its token and the request carries no token" in said and "?token=" in said
    assert "Set-Cookie" not in headers


@pytest.mark.parametrize("path", ["", "api/jobs/events", "api/job", "api/logs", "api/files", "api/download"])
def test_a_foreign_host_is_refused_even_with_the_token(board: ddp_client.web.RunningDashboard, path: str) -> None:
    """What a page whose name was rebound to 127.0.0.1 sends: its own name as the Host."""
    port = urlsplit(board.url).port
    status, _, body = get(board.link(path, namespace="ns", name="a"), {"Host": f"evil.example:{port}"})
    assert status == 403
    assert "Host 'evil.example:" in body and "DNS rebinding" in body


def test_a_request_from_another_origin_is_refused_even_with_the_token(board: ddp_client.web.RunningDashboard) -> None:
    status, _, body = get(board.link("api/config"), {"Origin": "http://evil.example"})
    assert status == 403 and "another origin ('http://evil.example')" in json.loads(body)["error"]
    own = board.address.rstrip("/")
    assert get(board.link("api/config"), {"Origin": own})[0] == 200


def test_without_a_token_a_trusted_proxy_s_name_is_answered() -> None:
    running = ddp_client.dashboard("ns", api_client=client.ApiClient(), s3_access=S3Access(), token=False,
                                   accept_hosts=("board.example",))
    try:
        assert "token" not in running.url
        status, _, body = get(f"{running.address}api/config", {"Host": "board.example"})
        assert (status, json.loads(body)) == (200, {"namespace": "ns"})
        assert get(f"{running.address}api/config", {"Host": "evil.example"})[0] == 403
    finally:
        running.stop()
