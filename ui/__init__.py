"""The ops page: a live, server-rendered view of the fleet (``toolfleet ui``, or mounted).

Mount it in a host application::

    from starlette.applications import Starlette
    from starlette.routing import Mount
    from toolfleet.ui import UiConfig, create_app, Principal, Role

    ops = create_app(UiConfig(redis_client=lambda: redis.Redis.from_url(URL),
                              auth=lambda request: Principal(Role.VIEWER, request.user.id)))
    app = Starlette(routes=[Mount("/ops", app=ops)])

Needs the ``[ui]`` extra. See ``docs/ui.md``.
"""

from toolfleet.ui.app import create_app
from toolfleet.ui.auth import Principal, Role, Sessions, TokenEntry, load_tokens
from toolfleet.ui.config import UiConfig

__all__ = ["Principal", "Role", "Sessions", "TokenEntry", "UiConfig", "create_app", "load_tokens"]
