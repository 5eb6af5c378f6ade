"""Every Redis script lives in a ``.lua`` file and names every key it touches in ``KEYS``.

What Redis Cluster requires of a script (its keys declared, so they can be routed), read
statically from the sources: each ``redis.call``'s key arguments must be ``KEYS[...]``
(an index computed in Lua is fine; a key computed in Lua is not), and no Python module
of the four packages embeds a Lua script of its own.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from toolfleet.shared import scripts

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "shared" / "scripts"

#: Commands without key arguments (a pub/sub channel is not a key).
KEYLESS = {"publish", "time", "ping", "echo"}
#: Commands whose every argument is a key.
ALL_KEYS = {"del", "exists", "unlink", "touch", "mget", "watch"}
#: Commands whose first two arguments are keys.
TWO_KEYS = {"lmove", "blmove", "rpoplpush", "brpoplpush", "smove", "rename", "renamenx"}
CALL = re.compile(r"redis\.p?call\s*\(")


def _strip_comments(lua: str) -> str:
    return "\n".join(line.split("--", 1)[0] if "--" in line else line for line in lua.split("\n"))


def _arguments(text: str, start: int) -> list[str]:
    """The top-level comma-separated arguments of the call whose ``(`` is at ``start - 1``."""
    depth, quote, args, current = 0, "", [], []
    for char in text[start:]:
        if quote:
            current.append(char)
            if char == quote:
                quote = ""
            continue
        if char in "\"'":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                args.append("".join(current).strip())
                return args
            depth -= 1
        elif char == "," and depth == 0:
            args.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    raise AssertionError("unbalanced redis.call")


def _is_keys_entry(argument: str) -> bool:
    """Whether ``argument`` is one ``KEYS[<index>]`` expression, whatever the index."""
    if not argument.startswith("KEYS[") or not argument.endswith("]"):
        return False
    depth = 0
    for i, char in enumerate(argument[4:], start=4):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth == 0:
            return i == len(argument) - 1
    return False


def key_problems(lua: str) -> list[str]:
    """Each ``redis.call`` of ``lua`` whose key argument is not a ``KEYS[...]`` entry."""
    code = _strip_comments(lua)
    problems = []
    for match in CALL.finditer(code):
        args = _arguments(code, match.end())
        command = args[0].strip("\"'").lower()
        if not re.fullmatch(r"[\"'][A-Za-z]+[\"']", args[0]):
            problems.append(f"command not a literal: {args[0]}")
            continue
        if command in KEYLESS:
            continue
        count = len(args) - 1 if command in ALL_KEYS else 2 if command in TWO_KEYS else 1
        for key in args[1 : 1 + count]:
            if ".." in key or not _is_keys_entry(key):
                problems.append(f"{command} on {key!r}")
    return problems


def test_the_check_fails_on_keys_built_in_lua() -> None:
    """A key concatenated in Lua, or taken from ARGV or a variable, is a problem; KEYS is not."""
    assert key_problems('redis.call("get", ARGV[1] .. "x")') == ["get on 'ARGV[1] .. \"x\"'"]
    assert key_problems('local k = ARGV[6] .. "inflight:" .. s\nredis.call("zcard", k)')
    assert key_problems('redis.call("exists", ARGV[7] .. id)')
    assert key_problems('redis.call("del", KEYS[1], "ns:" .. id)')
    assert key_problems('redis.call("lmove", KEYS[1], ARGV[1], "LEFT", "RIGHT")')
    assert key_problems("redis.call(command, KEYS[1])")
    assert key_problems('redis.call("get", KEYS[1] .. KEYS[2])')
    fine = 'redis.call("zadd", KEYS[3 + 2 * i], 1, ARGV[1] .. "m")  -- a member may be built'
    assert key_problems(fine + '\nredis.call("publish", ARGV[4], ARGV[5])') == []


@pytest.mark.parametrize("name", scripts.names())
def test_every_script_names_its_keys_in_keys(name: str) -> None:
    """Each packaged script's key arguments are all ``KEYS[...]`` entries."""
    assert key_problems((SCRIPTS / f"{name}.lua").read_text()) == []


def test_scripts_are_found_and_load() -> None:
    """The loader finds the packaged scripts and fills their constants in."""
    names = scripts.names()
    assert {"enqueue", "fetch", "claim", "finish", "cancel_queued", "republish"} <= set(names)
    assert "${" not in scripts.source("enqueue", TOKEN="*")


def test_no_python_module_embeds_a_lua_script() -> None:
    """Every script is a ``.lua`` file: no module of the packages holds ``redis.call``."""
    embedding = [
        str(path.relative_to(ROOT))
        for folder in ("shared", "producer", "worker", "extensions")
        for path in (ROOT / folder).rglob("*.py")
        if CALL.search(path.read_text())
    ]
    assert embedding == []
