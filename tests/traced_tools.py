"""Test-only extension for tracing tests: it configures the OpenTelemetry SDK of the worker
process it is loaded into, exporting every span as one JSON line to the file named by
``TOOLFLEET_TEST_SPANS_FILE`` (SDK's ConsoleSpanExporter; no network)."""

from __future__ import annotations

import logging
import os

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from pydantic import BaseModel

from toolfleet.shared import Extension, ExtensionContext, Tool

log = logging.getLogger("traced_tools")


def _line(span: ReadableSpan) -> str:
    return span.to_json(indent=None) + "\n"


def _configure() -> None:
    path = os.environ.get("TOOLFLEET_TEST_SPANS_FILE")
    if not path:
        return
    provider = TracerProvider(resource=Resource.create({"service.name": "toolfleet-worker"}))
    out = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the process's life
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=out, formatter=_line)))
    trace.set_tracer_provider(provider)


_configure()


class ShoutArguments(BaseModel):
    text: str


class Shout(Tool):
    """Log a line, then return the text in capitals."""

    name = "shout"
    arguments_model = ShoutArguments

    def call(self, arguments: ShoutArguments, context: ExtensionContext) -> str:
        log.info("shouting %d characters", len(arguments.text))
        return arguments.text.upper()


extension = Extension(
    slug="traced", version="0.0.1", description="Tracing test tools.", tools=[Shout]
)
