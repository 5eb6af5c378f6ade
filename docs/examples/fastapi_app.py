"""A FastAPI back end that runs a model turn's tool calls on the fleet (``AsyncToolClient``).

Endpoints (the body is an OpenAI Chat Completions response, or its assistant message;
Responses and Anthropic messages work the same way):

- ``POST /tool-messages?account=acme`` → ``{"messages": [...]}``: the tool messages to
  append to the conversation before the next model request, one per tool call, in order.
- ``POST /tool-messages/stream?account=acme`` → NDJSON: one line per call event
  (``queued``, ``running`` with the tool's text, e.g. "Fetching weather for Paris…",
  ``progress``, ``result``) as it happens, then ``{"messages": [...]}``.

A body that is no known message format answers 422. Run it with a fleet on the same
Redis (``toolfleet worker``)::

    TOOLFLEET_REDIS_URL=redis://127.0.0.1:6379/0 uvicorn fastapi_app:app  # in docs/examples
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Body, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from toolfleet.producer import AsyncToolClient, CallEvent
from toolfleet.producer.turns import parse_tool_calls
from toolfleet.shared import ClientError

Completion = Annotated[dict[str, Any], Body(description="A chat completion response.")]


def create_app(
    redis_url: str | None = None, *, namespace: str | None = None, timeout_s: float = 20.0
) -> FastAPI:
    """The application.

    Args:
        redis_url: the fleet's Redis; ``None`` reads ``TOOLFLEET_REDIS_URL``.
        namespace: the fleet's key prefix; ``None`` reads ``TOOLFLEET_NAMESPACE``.
        timeout_s: one deadline for all the tool calls of a turn, seconds.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # One client per process, shared by every request: one reply connection however
        # many calls are in flight. Closing it lets calls in flight resolve first.
        async with AsyncToolClient(redis_url, namespace=namespace) as client:
            app.state.toolfleet = client
            yield

    app = FastAPI(title="toolfleet example", lifespan=lifespan)

    @app.exception_handler(ClientError)
    async def bad_turn(request: Request, exc: ClientError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.post("/tool-messages")
    async def tool_messages(
        request: Request, completion: Completion, account: str | None = None
    ) -> dict[str, Any]:
        """Run every tool call of the completion; return the tool messages, in order."""
        client: AsyncToolClient = request.app.state.toolfleet
        messages = await client.dispatch(
            completion, context={"account": account}, timeout_s=timeout_s
        )
        return {"messages": messages}

    @app.post("/tool-messages/stream")
    async def tool_messages_stream(
        request: Request, completion: Completion, account: str | None = None
    ) -> StreamingResponse:
        """Stream each call's events as NDJSON lines, then the tool messages."""
        client: AsyncToolClient = request.app.state.toolfleet
        parse_tool_calls(completion)  # a bad body answers 422 before the stream starts

        async def lines() -> AsyncIterator[str]:
            # ``async with``: a client that disconnects cancels the calls still running
            async with client.stream(
                completion, context={"account": account}, timeout_s=timeout_s
            ) as events:
                async for event in events:
                    yield json.dumps(_public(event)) + "\n"
            yield json.dumps({"messages": events.messages}) + "\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    return app


def _public(event: CallEvent) -> dict[str, Any]:
    """What a chat UI needs of an event (no internal ids)."""
    return {
        "kind": event.kind,
        "index": event.index,
        "tool_call_id": event.tool_call_id,
        "function": event.function,
        "description": event.description,
        "status": event.status,
    }


app = create_app()
