"""The ops page as an ASGI application (Starlette): pages, live stream, actions, probes.

Routes, relative to wherever the app is mounted::

    GET  /  /workers  /tenants  /failures?q=  /switches     pages (full HTML, numbers in it)
    GET  /stream?page=NAME&q=                                server-sent events: the page's
                                                             live region, once per snapshot
    GET  /login   POST /login (form: token, csrf)   POST /logout
    POST /switches (name, state, csrf)                       operator
    POST /dead-letters/retry | /dead-letters/delete (queue, id, csrf)   operator
    GET  /livez   /readyz                                    probes (no auth)
    GET  /static/...                                         the page's own CSS and JS

Every response carries a Content-Security-Policy that allows only the app's own assets.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio.to_thread
import jinja2
import redis
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import (
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from toolfleet.shared.group_copies import hset_everywhere
from toolfleet.shared.naming import switches_key
from toolfleet.ui import views
from toolfleet.ui.auth import LOGIN_COOKIE, SESSION_COOKIE, Principal, Role, Sessions
from toolfleet.ui.config import UiConfig
from toolfleet.ui.dead_letters import RetryRefused, delete_dead_letter, retry
from toolfleet.ui.poller import Poller
from toolfleet.ui.snapshot import Failure, Snapshot, read_snapshot

__all__ = ["CSP", "create_app"]

HERE = Path(__file__).resolve().parent

#: Only the app's own scripts, styles and connections; no frames, no foreign form targets.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

#: The principal of an app without authentication (loopback only, enforced by the CLI).
ANONYMOUS = Principal(Role.OPERATOR, "anonymous")


class _Headers(BaseHTTPMiddleware):
    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        response.headers.setdefault("Cache-Control", "no-store")
        return response


class _Forbidden(Exception):
    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status
        self.why = why


def create_app(config: UiConfig) -> Starlette:
    """The ops page application for ``config`` (mount it anywhere: it uses ``root_path``).

    Args:
        config: where the fleet is and who may look (:class:`~toolfleet.ui.config.UiConfig`).

    Returns:
        A Starlette application; its lifespan stops the poller.
    """
    client = config.redis_client()
    anonymous_id = secrets.token_hex(16)  # the session id of every visitor without auth
    # CSRF tokens are HMACs of the principal's session id: under the sessions' key, else
    # under a per-process key (a host's callback, or no auth)
    signer = config.sessions or Sessions(())

    def read() -> Any:
        return read_snapshot(client, config.namespace, worker_ttl_s=config.worker_ttl_s)

    poller = Poller(read, config.interval_s)
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True
    )
    templates = Jinja2Templates(env=environment)
    templates.env.filters.update(views.FILTERS)

    async def principal(request: Request) -> Principal | None:
        if config.auth is not None:
            decided = config.auth(request)
            if inspect.isawaitable(decided):
                decided = await decided
            return decided
        if config.sessions is not None:
            return config.sessions.check(request.cookies.get(SESSION_COOKIE))
        return Principal(ANONYMOUS.role, anonymous_id)

    def csrf_for(who: Principal) -> str:
        return signer.csrf_token(who.session_id)

    def may_act(who: Principal) -> bool:
        return who.may_act and not config.read_only

    def base(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    async def page(request: Request) -> Response:
        who = await principal(request)
        if who is None:
            return _login_needed(request, base(request), config.sessions is not None)
        name = request.path_params.get("page", "overview")
        if name not in views.PAGES:
            return PlainTextResponse("not found", status_code=404)
        try:
            snapshot = await poller.current()
        except redis.RedisError as exc:
            return PlainTextResponse(f"the fleet's Redis does not answer: {exc}", status_code=503)
        q = request.query_params.get("q", "").strip()
        lookup = await _lookup(client, snapshot, q) if name == "failures" else None
        matches = await _search(client, snapshot, q) if name == "failures" else None
        context = views.context(
            name, snapshot, q=q, lookup=lookup, matches=matches, may_act=may_act(who),
            csrf=csrf_for(who),
            role=who.role.value, base=base(request), error=poller.error,
            message=request.query_params.get("message", ""),
            login=config.sessions is not None, read_only=config.read_only,
        )  # fmt: skip
        return templates.TemplateResponse(request, "page.html", context)

    async def stream(request: Request) -> Response:
        who = await principal(request)
        if who is None:
            return PlainTextResponse("log in first", status_code=401)
        name = request.query_params.get("page", "overview")
        if name not in views.PAGES:
            return PlainTextResponse("no such page", status_code=404)
        q = request.query_params.get("q", "").strip()
        lookup = None
        matches = None
        if name == "failures":
            try:
                current = await poller.current()
                lookup = await _lookup(client, current, q)
                matches = await _search(client, current, q)
            except redis.RedisError:
                lookup = None
        template = templates.get_template(f"{name}.html")
        acting = may_act(who)
        token = csrf_for(who)

        async def events() -> AsyncIterator[str]:
            yield "retry: 3000\n\n"
            async for snapshot in poller.updates():
                html = template.render(
                    views.context(
                        name,
                        snapshot,
                        q=q,
                        lookup=lookup,
                        matches=matches,
                        may_act=acting,
                        csrf=token,
                        role=who.role.value,
                        base=base(request),
                        error=poller.error,
                    )  # fmt: skip
                )
                data = "".join(f"data: {line}\n" for line in html.splitlines())
                yield f"event: update\n{data}\n"

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"X-Accel-Buffering": "no"}
        )

    async def acting(request: Request) -> tuple[Principal, FormData]:
        """The operator behind a state-changing request, after its CSRF check."""
        if not _same_origin(request):
            raise _Forbidden(403, "cross-origin request refused")
        who = await principal(request)
        if who is None:
            raise _Forbidden(401, "log in first")
        form = await request.form()
        if not signer.csrf_ok(who.session_id, str(form.get("csrf", ""))):
            raise _Forbidden(403, "missing or wrong CSRF token")
        if config.read_only:
            raise _Forbidden(403, "this ops page is read-only")
        if not who.may_act:
            raise _Forbidden(403, "operators only")
        return who, form

    def guarded(
        handler: Callable[[Request, FormData], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                _who, form = await acting(request)
            except _Forbidden as refused:
                return PlainTextResponse(refused.why, status_code=refused.status)
            return await handler(request, form)

        return endpoint

    async def set_switch(request: Request, form: FormData) -> Response:
        name = str(form.get("name", ""))
        state = str(form.get("state", ""))
        snapshot = await poller.current()
        if state not in ("on", "off") or name not in views.switchable(snapshot):
            return PlainTextResponse("no such switch or state", status_code=400)
        # the fleet copy, and on a cluster every group's (the one its workers' claims read)
        await anyio.to_thread.run_sync(
            hset_everywhere, client, switches_key, config.namespace, name, state
        )
        return _back(request, base(request), "switches", f"{name} is now {state}")

    async def retry_letter(request: Request, form: FormData) -> Response:
        queue, redis_id = str(form.get("queue", "")), str(form.get("id", ""))
        prefix = (await poller.current()).prefix_of(queue)
        try:
            new_id = await anyio.to_thread.run_sync(
                functools.partial(retry, client, config.namespace, queue, redis_id, prefix=prefix)
            )
        except RetryRefused as exc:
            return _back(request, base(request), "failures", f"not retried: {exc}")
        return _back(request, base(request), "failures", f"retried as call {new_id}")

    async def delete_letter(request: Request, form: FormData) -> Response:
        queue, redis_id = str(form.get("queue", "")), str(form.get("id", ""))
        prefix = (await poller.current()).prefix_of(queue)
        removed = await anyio.to_thread.run_sync(
            functools.partial(
                delete_dead_letter, client, config.namespace, queue, redis_id, prefix=prefix
            )
        )
        said = "deleted" if removed else "already gone"
        return _back(request, base(request), "failures", f"dead letter {redis_id} {said}")

    async def login_form(request: Request) -> Response:
        if config.sessions is None:
            return RedirectResponse(base(request) + "/", status_code=303)
        pre = request.cookies.get(LOGIN_COOKIE) or secrets.token_hex(16)
        context = {"base": base(request), "csrf": config.sessions.csrf_token(pre),
                   "failed": request.query_params.get("failed") == "1"}  # fmt: skip
        response = templates.TemplateResponse(request, "login.html", context)
        _cookie(response, request, LOGIN_COOKIE, pre, max_age=3600)
        return response

    async def login(request: Request) -> Response:
        sessions = config.sessions
        if sessions is None:
            return PlainTextResponse("no login here", status_code=404)
        if not _same_origin(request):
            return PlainTextResponse("cross-origin request refused", status_code=403)
        form = await request.form()
        pre = request.cookies.get(LOGIN_COOKIE, "")
        if not pre or not sessions.csrf_ok(pre, str(form.get("csrf", ""))):
            return PlainTextResponse("missing or wrong CSRF token", status_code=403)
        role = sessions.role_of_token(str(form.get("token", "")))
        if role is None:
            return RedirectResponse(base(request) + "/login?failed=1", status_code=303)
        response = RedirectResponse(base(request) + "/", status_code=303)
        _cookie(response, request, SESSION_COOKIE, sessions.issue(role),
                max_age=sessions.max_age_s)  # fmt: skip
        response.delete_cookie(LOGIN_COOKIE, path=base(request) or "/")
        return response

    async def logout(request: Request) -> Response:
        sessions = config.sessions
        who = await principal(request)
        form = await request.form()
        if sessions is None or who is None:
            return RedirectResponse(base(request) + "/login", status_code=303)
        if not _same_origin(request) or not sessions.csrf_ok(
            who.session_id, str(form.get("csrf", ""))
        ):
            return PlainTextResponse("missing or wrong CSRF token", status_code=403)
        response = RedirectResponse(base(request) + "/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path=base(request) or "/")
        return response

    async def livez(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        try:
            await anyio.to_thread.run_sync(client.ping)
        except redis.RedisError as exc:
            return PlainTextResponse(f"Redis unreachable: {exc}", status_code=503)
        return PlainTextResponse("ok")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await poller.close()

    routes = [
        Route("/", page),
        Route("/livez", livez),
        Route("/readyz", readyz),
        Route("/stream", stream),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/switches", guarded(set_switch), methods=["POST"]),
        Route("/dead-letters/retry", guarded(retry_letter), methods=["POST"]),
        Route("/dead-letters/delete", guarded(delete_letter), methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
        Route("/{page}", page, methods=["GET"]),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(_Headers)], lifespan=lifespan)
    app.state.poller = poller
    return app


def _same_origin(request: Request) -> bool:
    """Whether a POST comes from this app's own pages.

    Its ``Origin``, when the browser sends one, must name this host.
    """
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    host = request.headers.get("host", "")
    return origin.split("://", 1)[-1] == host


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def _cookie(response: Response, request: Request, name: str, value: str, max_age: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=str(request.scope.get("root_path", "")).rstrip("/") or "/",
        httponly=True,
        samesite="strict",
        secure=_secure(request),
    )


def _login_needed(request: Request, base: str, login: bool) -> Response:
    if login:
        return RedirectResponse(base + "/login", status_code=303)
    return PlainTextResponse("not allowed", status_code=401)


def _back(request: Request, base: str, page: str, message: str) -> Response:
    from urllib.parse import urlencode

    target = "/" if page == "overview" else f"/{page}"
    return RedirectResponse(f"{base}{target}?{urlencode({'message': message})}", status_code=303)


async def _search(client: redis.Redis, snapshot: Snapshot, q: str) -> list[Failure] | None:
    """The failed calls a search for ``q`` finds in the whole failures index (None: no ``q``)."""
    if not q:
        return None
    prefixes = list(snapshot.group_prefixes) or [snapshot.namespace]
    return await anyio.to_thread.run_sync(views.search_failures, client, prefixes, q)


async def _lookup(client: redis.Redis, snapshot: Snapshot, q: str) -> views.Lookup | None:
    """The outcome of call ``q`` when ``q`` looks like a call id (one ``GET`` per group)."""
    if not views.looks_like_call_id(q):
        return None
    prefixes = list(snapshot.group_prefixes) or [snapshot.namespace]
    return await anyio.to_thread.run_sync(views.lookup_call, client, prefixes, q)
