"""What keeps the dashboard safe to run (issue 54, §4), as one ASGI middleware in front of every
route, streaming ones included:

- a bind address other than loopback needs a token (:func:`check_bind`); with a token, every
  request must bring it, once as ``?token=`` (then kept in an HttpOnly, SameSite=Strict cookie)
  or in that cookie;
- the ``Host`` header must name the address the server is bound to (or ``localhost`` /
  ``127.0.0.1``): a page of another site that rebinds its DNS name to 127.0.0.1 is refused;
- only ``GET``/``HEAD``, except the opt-in stacks request, which must come from the page itself
  (its ``Origin`` is the server's own);
- every answer carries ``Content-Security-Policy: default-src 'self'`` (no inline script, no
  other host) and headers that keep it out of frames and caches.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Optional, Set
from urllib.parse import parse_qsl, urlencode

Message = Dict[str, Any]
ASGIApp = Callable[[Message, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

#: The environment variable a token may come from instead of ``--token``.
TOKEN_ENV = "SGD_DASHBOARD_TOKEN"
CSP = "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]
#: The one route that takes a POST (the stacks request).
_POST_ROUTES = re.compile(r"^/api/runs/[0-9a-f]{1,64}/stacks$")
_WILDCARDS = {"0.0.0.0", "::", ""}
_TOKEN = re.compile(r"^[A-Za-z0-9._~-]{1,256}$")


def is_local(host: str) -> bool:
    """Whether ``host`` is a loopback name or address (only this machine can connect)."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: Optional[str]) -> None:
    """Refuse to serve on an address other machines can reach without a token.

    :raises ValueError: ``host`` is not loopback and there is no token (the message says what to do).
    """
    if token is not None and not token.strip():
        raise ValueError("the token is empty: pass --token with a long random value (python -c 'import secrets; "
                         "print(secrets.token_urlsafe(24))'), or leave it out on 127.0.0.1")
    if token is not None and not _TOKEN.match(token):
        raise ValueError("the token may hold only letters, digits and - _ . ~ (it travels in a URL and a cookie): "
                         "python -c 'import secrets; print(secrets.token_urlsafe(24))' makes one")
    if not is_local(host) and not token:
        raise ValueError(
            f"refusing to serve on {host or '0.0.0.0'} without a token: anyone who can reach that address could "
            f"read your runs. Pass --token TOKEN (or set {TOKEN_ENV}), or keep the default --host 127.0.0.1 and "
            "reach it through an SSH tunnel (ssh -L 6007:127.0.0.1:6007 HOST).")


def allowed_hosts_for(host: str) -> Optional[Set[str]]:
    """The ``Host`` names the server answers to when bound to ``host`` (``None``: any, for a
    wildcard bind, where the token is what guards it)."""
    if host.strip("[]") in _WILDCARDS:
        return None
    names = {host.strip("[]").lower(), "localhost", "127.0.0.1", "::1"}
    return names


def host_name(header: str) -> str:
    """The name in a ``Host`` header, without its port (``[::1]:6007`` → ``::1``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard:
    """The middleware: token, ``Host``, method and ``Origin`` checks, and the security headers.

    :param app: the application it guards.
    :param token: the token every request must bring (``None``: none, on loopback only).
    :param allowed_hosts: :func:`allowed_hosts_for` the bound address.
    :param cookie: the cookie's name (with the port in it: two dashboards on one machine keep theirs).
    """

    def __init__(self, app: ASGIApp, token: Optional[str], allowed_hosts: Optional[Iterable[str]],
                 cookie: str = "sgd_dashboard_token"):
        self.app = app
        self.token = token.encode() if token else None
        self.allowed = None if allowed_hosts is None else {h.lower() for h in allowed_hosts}
        self.cookie = cookie

    async def __call__(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host", "")
        if self.allowed is not None and host_name(host) not in self.allowed:
            await _refuse(send, 403, f"the Host header {host!r} is not an address this dashboard serves (a guard "
                                     "against DNS rebinding): open it at the URL it printed, such as "
                                     "http://127.0.0.1:PORT/")
            return
        method = scope.get("method", "GET")
        path = scope.get("path", "")
        if method not in ("GET", "HEAD") and not (method == "POST" and _POST_ROUTES.match(path)):
            await _refuse(send, 405, f"{method} is not allowed here: the dashboard only reads (GET), except "
                                     "POST /api/runs/<id>/stacks", [(b"allow", b"GET, HEAD")])
            return
        if method not in ("GET", "HEAD"):
            origin = headers.get("origin")
            if origin not in (f"http://{host}", f"https://{host}"):
                await _refuse(send, 403, f"a {method} must come from the dashboard's own page (Origin "
                                         f"{origin!r} is not http://{host})")
                return
        set_cookie: Optional[bytes] = None
        if self.token is not None:
            query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True))
            given = query.get("token")
            if given is not None and hmac.compare_digest(given.encode(), self.token):
                set_cookie = (f"{self.cookie}={self.token.decode()}; HttpOnly; SameSite=Strict; Path=/").encode()
                if method == "GET" and path == "/":  # take the token out of the address bar
                    rest = urlencode([(k, v) for k, v in query.items() if k != "token"])
                    await _redirect(send, "/" + (f"?{rest}" if rest else ""), set_cookie)
                    return
            elif not hmac.compare_digest(_cookie(headers.get("cookie", ""), self.cookie).encode(), self.token):
                await _refuse(send, 403, "this dashboard needs its token: open the URL `sgd dashboard` printed "
                                         "(it ends in ?token=...), or pass the token it was started with")
                return

        async def send_with_headers(message: Dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                extra: List[Any] = list(SECURITY_HEADERS)
                if set_cookie is not None:
                    extra.append((b"set-cookie", set_cookie))
                if path.startswith("/api/"):
                    extra.append((b"cache-control", b"no-store"))
                message = {**message, "headers": list(message.get("headers", [])) + extra}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _cookie(header: str, name: str) -> str:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return ""


async def _refuse(send: Any, status: int, error: str, extra: Optional[List[Any]] = None) -> None:
    body = json.dumps({"error": error}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               *SECURITY_HEADERS, *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _redirect(send: Any, location: str, cookie: bytes) -> None:
    headers = [(b"location", location.encode()), (b"set-cookie", cookie), (b"content-length", b"0"),
               *SECURITY_HEADERS]
    await send({"type": "http.response.start", "status": 303, "headers": headers})
    await send({"type": "http.response.body", "body": b""})
