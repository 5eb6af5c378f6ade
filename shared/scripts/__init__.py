"""Every Redis script toolfleet runs, read from the ``.lua`` files beside this module.

Dramatiq's model (``dramatiq/brokers/redis/dispatch.lua`` and its loader): each script
is a packaged data file, read once with :mod:`importlib.resources`, sent by its SHA1
(``EVALSHA``) and loaded again only when Redis answers ``NOSCRIPT`` (a restart, a
``SCRIPT FLUSH``) — redis-py's :class:`~redis.commands.core.Script` does exactly that.

Every key a script touches comes in ``KEYS``, named by :mod:`toolfleet.shared.naming`
(what Redis Cluster requires to route a script); none is built inside Lua.
``tests/test_lua_keys.py`` reads every ``.lua`` file and fails on one that is.

A script's source may name constants shared with Python as ``${NAME}``
(:class:`string.Template`); :func:`source` fills them in.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from string import Template

from redis.commands.core import Script

__all__ = ["names", "script", "source"]


def names() -> list[str]:
    """The names of every packaged script (``enqueue`` for ``enqueue.lua``), sorted."""
    files = resources.files(__name__).iterdir()
    return sorted(f.name.removesuffix(".lua") for f in files if f.name.endswith(".lua"))


@cache
def _raw(name: str) -> str:
    return resources.files(__name__).joinpath(f"{name}.lua").read_text(encoding="utf-8")


def source(name: str, **constants: str) -> str:
    """The Lua source of script ``name`` with its ``${NAME}`` constants filled in.

    Args:
        name: the file's name without ``.lua``.
        constants: the values of the ``${NAME}`` placeholders.

    Raises:
        FileNotFoundError: no such script.
        KeyError: a placeholder without a value.
    """
    return Template(_raw(name)).substitute(constants)


def script(name: str, **constants: str) -> Script:
    """Script ``name``, hashed once, run on the client passed at each call.

    Call it as ``script(keys=[...], args=[...], client=client)``: ``EVALSHA``, and on
    ``NOSCRIPT`` ``SCRIPT LOAD`` and ``EVALSHA`` again (redis-py's
    :class:`~redis.commands.core.Script`). The source is held as bytes, so no client's
    encoder is needed to hash it.

    Args:
        name: the file's name without ``.lua``.
        constants: the values of its ``${NAME}`` placeholders (see :func:`source`).
    """
    return Script(None, source(name, **constants).encode())  # type: ignore[arg-type]
