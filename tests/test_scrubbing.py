"""Secrets are scrubbed by value in every encoding, from replies, errors, logs and events."""

from __future__ import annotations

import base64
import io
import json
import logging
import time
import uuid
from typing import Any
from urllib.parse import quote, quote_plus

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from toolfleet.shared import Extension, ExtensionContext, ExtensionToolError, Tool
from toolfleet.shared.wire import ToolCallRequest, ToolCallResult, ToolEvent
from toolfleet.worker.pipeline.calls import CallPipeline
from toolfleet.worker.pipeline.observe import Observer
from toolfleet.worker.registry.registry import Registry
from toolfleet.worker.supervision.logs import JsonFormatter

#: Set by each example: the value the tools leak.
PLANTED: dict[str, str] = {}


class Nothing(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _secret() -> str:
    return PLANTED["secret"]


class LeakResult(Tool):
    """Return the secret raw, JSON-encoded, repr'd and in a URL."""

    name = "leak_result"
    arguments_model = Nothing

    def call(self, arguments: Nothing, context: ExtensionContext) -> dict[str, Any]:
        secret = _secret()
        context.logger.warning(
            "calling the API with key=%s (%r, %r)", secret, secret, secret.encode()
        )
        context.progress(f"using {secret}")
        return {
            "raw": secret,
            "json": json.dumps({"key": secret}),
            "json_ascii": json.dumps(secret, ensure_ascii=True),
            "double": json.dumps(json.dumps(secret)),
            "repr": repr({"key": secret}),
            "url": "https://api.example.com/v1?key=" + quote(secret, safe=""),
            "form": "key=" + quote_plus(secret),
            "bytes": f"{secret.encode()!r}",
            "ascii": ascii(secret),
            "base64": base64.b64encode(secret.encode()).decode(),
            secret: "as a key",
            "list": [secret, {"nested": secret}],
        }


class LeakError(Tool):
    """Fail with the secret in the message the model reads."""

    name = "leak_error"
    arguments_model = Nothing

    def call(self, arguments: Nothing, context: ExtensionContext) -> str:
        raise ExtensionToolError(f"the API refused key {_secret()!r} ({json.dumps(_secret())})")


class LeakCrash(Tool):
    """Crash with the secret in the exception (logged with its traceback)."""

    name = "leak_crash"
    arguments_model = Nothing

    def call(self, arguments: Nothing, context: ExtensionContext) -> str:
        raise RuntimeError(f"cannot connect with {_secret()!r} to {quote(_secret())}")


def _forms(secret: str) -> set[str]:
    """The encodings a leak would show (computed here, independently of the redactor)."""
    in_bytes = repr(secret.encode())[2:-1]
    return {
        secret,
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        repr(secret)[1:-1],
        ascii(secret)[1:-1],
        in_bytes,
        json.dumps(in_bytes)[1:-1],
        base64.b64encode(secret.encode()).decode(),
        quote(secret, safe=""),
        quote_plus(secret),
    }


SPECIALS = st.sampled_from(['"', "\\", "\t", "\n", "'", "é", "密", "\u2028", "%", "+", " "])
SECRETS = st.builds(
    lambda head, specials, tail: head + "".join(specials) + tail,
    st.text(alphabet=st.characters(codec="utf-8", categories=["L", "N"]), min_size=6, max_size=12),
    st.lists(SPECIALS, min_size=1, max_size=4),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(secret=SECRETS)
def test_planted_secret_appears_in_no_reply_log_record_or_event(secret: str) -> None:
    """A secret with quotes, backslashes, tabs, newlines or non-ASCII characters, returned by a
    tool (also as the repr of its UTF-8 bytes, ascii() and base64), raised in its errors and
    logged, appears in no encoding in any reply, log or event."""
    assume(secret.strip() == secret and len(secret) >= 8)
    PLANTED["secret"] = secret
    registry = Registry(f"scrub-{uuid.uuid4().hex[:6]}")
    registry.add_extension(
        Extension(slug="leaky", version="1.0.0", tools=[LeakResult, LeakError, LeakCrash])
    )
    registry.redactor.add({secret})
    events: list[ToolEvent] = []
    pipeline = CallPipeline(
        registry, worker_id="test:1", emit=lambda request, event: events.append(event)
    )
    observer = Observer(registry, "test:1")
    stream = io.StringIO()
    handlers = []
    for formatter in (JsonFormatter(), logging.Formatter("%(levelname)s %(name)s: %(message)s")):
        handler = logging.StreamHandler(stream)
        handler.setFormatter(formatter)
        handler.addFilter(registry.redactor.log_filter())
        handlers.append(handler)
    root = logging.getLogger()
    for handler in handlers:
        root.addHandler(handler)
    try:
        texts: list[str] = []
        results: list[ToolCallResult] = []
        for tool in ("leak_result", "leak_error", "leak_crash"):
            request = ToolCallRequest(
                id=str(uuid.uuid4()), function=f"ext_leaky_{tool}", arguments={},
                reply_to="unused", deadline=time.time() + 10, timeout_s=10, events=True,
            )  # fmt: skip
            requested = observer.requested(request)
            result = pipeline.call(request)
            responded = observer.responded(request, result, "tools.leaky", True)
            results.append(result)
            texts += [result.model_dump_json(), json.dumps(requested), json.dumps(responded)]
        texts += [event.model_dump_json() for event in events]
        texts.append(stream.getvalue())
    finally:
        for handler in handlers:
            root.removeHandler(handler)
    assert [r.status.value for r in results] == ["ok", "tool_error", "crashed"]
    assert "[redacted]" in texts[0] and "calling the API with key=[redacted]" in texts[-1]
    for form in _forms(secret):
        for text in texts:
            assert form not in text, (form, text[:2000])
