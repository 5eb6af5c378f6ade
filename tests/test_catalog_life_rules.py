"""The catalog's life rules without Redis: which names readers list, a tool's identity and
schema hash, the pin a worker checks, and the schema hash in the exported tool lists."""

from __future__ import annotations

from toolfleet.shared import Status
from toolfleet.shared.catalog import CatalogEntry
from toolfleet.shared.catalog_life import (
    CHANGED_SINCE_LISTED,
    beats_of,
    listed,
    pin_refusal,
    schema_hash,
)
from toolfleet.shared.export import FORMATS, SCHEMA_HASH_KEY, export_tools
from toolfleet.shared.naming import tool_identity
from toolfleet.shared.wire import ToolCallRequest

PARAMETERS = {"type": "object", "properties": {"size": {"type": "integer"}}}


def test_a_name_is_listed_while_a_heartbeat_within_the_ttl_serves_it() -> None:
    """A name whose newest heartbeat is at or after the cutoff is listed, one before it is
    not, and one without any liveness record (an older worker's) is listed."""
    entries = {"fresh": 1, "edge": 2, "stale": 3, "legacy": 4}
    beats = beats_of([(b"fresh", 105.0), (b"edge", 100.0), ("stale", 99.999)])
    assert listed(entries, beats, cutoff=100.0) == {"fresh": 1, "edge": 2, "legacy": 4}


def test_identity_and_schema_hash() -> None:
    """The identity names slug and tool (two tools of one plain name differ); the schema
    hash ignores key order and changes with the description or the parameters."""
    assert tool_identity("a", "b_c") != tool_identity("a-b", "c")
    assert CatalogEntry(name="ext_a_b_c", queue="q", slug="a", tool="b_c").identity == "a/b_c"
    assert CatalogEntry(name="x", queue="q").identity is None
    reordered = {"properties": {"size": {"type": "integer"}}, "type": "object"}
    assert schema_hash("Measure.", PARAMETERS) == schema_hash("Measure.", reordered)
    assert schema_hash("Measure.", PARAMETERS) != schema_hash("Measure it.", PARAMETERS)
    assert schema_hash("Measure.", PARAMETERS) != schema_hash("Measure.", {"type": "object"})
    assert len(schema_hash(None, None)) == 16


def test_a_pin_refuses_another_tool_or_another_schema_and_says_list_tools_again() -> None:
    """No pin, or the served tool's identity and hash: runs. Another identity or hash:
    not_available, with the message that tells the model to list tools again."""
    args = ("ext_a_b_c", "a/b_c", "h1")
    assert pin_refusal(*args, asked_identity=None, asked_hash=None) is None
    assert pin_refusal(*args, asked_identity="a/b_c", asked_hash="h1") is None
    for asked in ({"asked_identity": "a-b/c", "asked_hash": None},
                  {"asked_identity": None, "asked_hash": "h0"}):  # fmt: skip
        refused = pin_refusal(*args, **asked)
        assert refused is not None and refused.status is Status.NOT_AVAILABLE
        assert refused.message.startswith(CHANGED_SINCE_LISTED.split("(")[0])
        assert "list tools again" in refused.message


def test_exports_carry_the_schema_hash_only_where_the_format_allows() -> None:
    """MCP tools carry it in _meta; the other model formats only with metadata=True, as a
    metadata object; display never; an entry without a hash adds nothing."""
    entry = {"name": "ext_ren_measure", "description": "Measure.", "parameters": PARAMETERS,
             "schema_hash": "abc123"}  # fmt: skip
    (mcp,) = export_tools([entry], "mcp")
    assert mcp["_meta"] == {SCHEMA_HASH_KEY: "abc123"}
    for fmt in set(FORMATS) - {"mcp", "display"}:
        (plain,) = export_tools([entry], fmt)
        assert "metadata" not in plain and "_meta" not in plain
        (tagged,) = export_tools([entry], fmt, metadata=True)
        assert tagged["metadata"] == {SCHEMA_HASH_KEY: "abc123"}
    (display,) = export_tools([entry], "display", metadata=True)
    assert "metadata" not in display
    (bare,) = export_tools([{**entry, "schema_hash": ""}], "mcp")
    assert "_meta" not in bare


def test_a_request_without_pins_encodes_as_before_and_an_old_reader_ignores_them() -> None:
    """identity and schema_hash are left out of the encoding when unset, and a request
    carrying them decodes with them."""
    base = {"id": "1", "function": "f", "reply_to": "r", "deadline": 1.0, "timeout_s": 1.0}
    plain = ToolCallRequest.model_validate(base).encode()
    assert b"identity" not in plain and b"schema_hash" not in plain
    pinned = ToolCallRequest.model_validate({**base, "identity": "a/b", "schema_hash": "h"})
    decoded = ToolCallRequest.decode(pinned.encode())
    assert (decoded.identity, decoded.schema_hash) == ("a/b", "h")
