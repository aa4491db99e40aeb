"""Who may read the dashboard: requests for this machine's own address (not a page's name rebound to
127.0.0.1), from its own pages (not another origin's scripts), that carry the token of the URL it printed.

The pages show what the user's kubeconfig and S3 credentials can read, so a page the user opens elsewhere
must not read them through the user's browser: DNS rebinding makes `http://evil.example:8265/` reach
127.0.0.1:8265 with the Host `evil.example:8265`, and a script of any origin can ask 127.0.0.1 directly.
As `kubectl proxy --accept-hosts` and Jupyter do, the Host is checked, cross-origin calls are refused and
every request needs the token; pure functions here, applied by server.py's middleware."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from urllib.parse import urlsplit

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
TOKEN_PARAMETER = "token"


def new_token() -> str:
    return secrets.token_urlsafe(24)


def cookie_name(port: int) -> str:
    """Cookies are not kept apart by port: two dashboards on one machine each keep their own."""
    return f"ddp-dashboard-token-{port}"


def token_cookie(port: int, token: str) -> str:
    """The Set-Cookie value that keeps the token for the page's own requests, out of reach of its scripts and
    of requests that other sites start."""
    cookie: SimpleCookie = SimpleCookie()
    cookie[cookie_name(port)] = token
    morsel = cookie[cookie_name(port)]
    morsel["path"], morsel["samesite"] = "/", "Strict"
    morsel["httponly"] = True
    return morsel.OutputString()


@dataclass(frozen=True)
class Access:
    """What a request must bring: a Host of this machine's (or one given), and the token (None: none needed,
    for a trusted proxy in front that checks who comes)."""

    token: str | None = field(default_factory=new_token)
    hosts: frozenset[str] = frozenset()  # names besides the loopback ones, as a trusted proxy sends them

    def names(self) -> frozenset[str]:
        return LOOPBACK_NAMES | {name.lower() for name in self.hosts}

    def host_refusal(self, host: str | None, port: int) -> str | None:
        """Why a request with this Host header is refused, or None. The port must be the one served; a name
        given with `hosts` may come with any port (a proxy's own) or none."""
        name, given_port = split_host(host or "")
        if name in LOOPBACK_NAMES and (given_port == port or (given_port is None and port == 80)):
            return None
        if name in {n.lower() for n in self.hosts}:
            return None
        allowed = f"127.0.0.1:{port} or localhost:{port}"
        return (f"Host {host!r} is not this dashboard's address: it answers only at {allowed}, so that a web page "
                "cannot reach it under its own name (DNS rebinding). Open the address `kubectl ddp dashboard` "
                "printed; behind a proxy you trust, let its name in with --accept-host NAME")

    def origin_refusal(self, headers: Mapping[str, str], host: str | None) -> str | None:
        """Why a request that another site's page started is refused, or None. Browsers say so in `Origin`
        (on scripts' CORS requests) and in `Sec-Fetch-Site` (on every request): only the dashboard's own
        pages are answered, and another site may only open a page of it for the user, a top-level navigation
        (a link from a notebook), as the Fetch Metadata resource isolation policy has it."""
        origin = headers.get("Origin")
        if origin is not None and not (host and origin.lower() in (f"http://{host.lower()}", f"https://{host.lower()}")):
            return (f"a request from the page of another origin ({origin!r}) is refused: the dashboard answers only "
                    "its own pages")
        site = (headers.get("Sec-Fetch-Site") or "").lower()
        opened = headers.get("Sec-Fetch-Mode") == "navigate" and headers.get("Sec-Fetch-Dest") == "document"
        if site in ("cross-site", "same-site") and not opened:
            return (f"a request that another site's page started (Sec-Fetch-Site: {site}) is refused: the dashboard "
                    "answers only its own pages")
        return None

    def token_refusal(self, given: str | None) -> str | None:
        """Why a request with this token (None: none) is refused, or None."""
        if self.token is None or (given is not None and hmac.compare_digest(given.encode(), self.token.encode())):
            return None
        said = "no token" if given is None else "a wrong token"
        return (f"this dashboard needs its token and the request carries {said}: open the address "
                "`kubectl ddp dashboard` printed (it ends with ?token=...), or send the token as ?token=... or "
                "the header `Authorization: token ...`")


def split_host(host: str) -> tuple[str, int | None]:
    """('name', port or None) of a Host header: 'localhost:8265', '[::1]:8265', '127.0.0.1'."""
    parsed = urlsplit(f"//{host}")
    try:
        port = parsed.port
    except ValueError:  # a port that is no number
        return host.lower(), -1
    return (parsed.hostname or "").lower(), port


def given_token(query: Mapping[str, str], headers: Mapping[str, str], cookies: Mapping[str, str],
                port: int) -> str | None:
    """The token a request carries: in the query, the Authorization header (`token T` or `Bearer T`), or
    the cookie the dashboard set when its printed address was opened."""
    if TOKEN_PARAMETER in query:
        return query[TOKEN_PARAMETER]
    scheme, _, value = (headers.get("Authorization") or "").partition(" ")
    if scheme.lower() in ("token", "bearer") and value.strip():
        return value.strip()
    return cookies.get(cookie_name(port))
