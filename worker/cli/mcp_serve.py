"""``toolfleet mcp serve``: the fleet as an MCP server (stdio or stateless Streamable HTTP)."""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
from pathlib import Path
from typing import Any

import click

from toolfleet.shared.errors import ConfigurationError

__all__ = ["mcp"]

MISSING_EXTRA = "the MCP gateway needs the mcp extra: pip install 'toolfleet[mcp]'"


@click.group()
def mcp() -> None:
    """Serve the fleet's tools to MCP clients."""


@mcp.command()
@click.option(
    "--transport",
    type=click.Choice(["stdio", "http"]),
    default="stdio",
    show_default=True,
    help="stdio for a desktop client that starts this process; http for the network.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="HTTP address to bind.")
@click.option("--port", type=int, default=8765, show_default=True, help="HTTP port.")
@click.option(
    "--tokens-file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="TOOLFLEET_MCP_TOKENS_FILE",
    help="TOML file of bearer-token SHA-256 digests and their accounts (HTTP).",
)
@click.option(
    "--token-verifier",
    metavar="MODULE:ATTR",
    help="An MCP SDK TokenVerifier (or a factory of one) instead of --tokens-file (HTTP).",
)
@click.option(
    "--no-auth",
    is_flag=True,
    help="Serve HTTP without tokens: anyone who reaches the port calls as --account.",
)
@click.option("--account", help="Account of unauthenticated callers (stdio, --no-auth).")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds a call may take when the request names no budget.",
)
@click.option(
    "--max-timeout",
    "max_timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="Largest budget a request may ask for (_meta toolfleet/timeout_s), seconds.",
)
@click.option(
    "--watch-interval",
    "watch_interval_s",
    type=click.FloatRange(min=0.05),
    default=2.0,
    show_default=True,
    help="Seconds between catalog checks for tools/list_changed notifications.",
)
@click.option(
    "--max-in-flight",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="Most calls in flight per gateway process; further calls wait, then are rejected.",
)
@click.pass_obj
def serve(obj: Any, /, transport: str, host: str, port: int, **options: Any) -> None:
    """Serve the fleet as an MCP server until stdin closes (stdio) or SIGTERM (http)."""
    url: str = obj.require_url()
    try:
        from toolfleet.producer.async_client import AsyncToolClient
        from toolfleet.producer.mcp import Caller, GatewayConfig
    except ImportError:
        raise click.ClickException(MISSING_EXTRA) from None
    # stdout carries MCP messages on stdio: every log line goes to stderr
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s"
    )
    config = GatewayConfig(
        default_timeout_s=options["timeout_s"],
        max_timeout_s=max(options["max_timeout_s"], options["timeout_s"]),
        watch_interval_s=options["watch_interval_s"],
        default_caller=Caller(options["account"]),
    )
    client = AsyncToolClient(
        url,
        namespace=obj.settings.namespace,
        settings=obj.settings,
        max_in_flight=options["max_in_flight"],
    )
    if transport == "stdio":
        from toolfleet.producer.mcp import serve_stdio

        async def run_stdio() -> None:
            async with client:
                await serve_stdio(client, config)

        asyncio.run(run_stdio())
        return
    verifier = _verifier(options["tokens_file"], options["token_verifier"], options["no_auth"])
    _serve_http(client, config, verifier, host, port)


def _verifier(tokens_file: Path | None, spec: str | None, no_auth: bool) -> Any:
    """The token verifier the options name; ``None`` only with ``--no-auth``."""
    chosen = [
        name
        for name, value in (
            ("--tokens-file", tokens_file),
            ("--token-verifier", spec),
            ("--no-auth", no_auth),
        )
        if value
    ]
    if len(chosen) > 1:
        raise click.UsageError(f"{' and '.join(chosen)} exclude each other")
    if not chosen:
        raise click.UsageError(
            "HTTP needs --tokens-file or --token-verifier, or --no-auth to serve without tokens"
        )
    if no_auth:
        return None
    if tokens_file is not None:
        from toolfleet.producer.mcp import StaticTokenVerifier

        return StaticTokenVerifier.from_file(tokens_file)
    return _import_verifier(str(spec))


def _import_verifier(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise click.UsageError(f"--token-verifier {spec!r}: expected MODULE:ATTR")
    try:
        value = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"--token-verifier {spec}: {exc}") from None
    verifier = value if hasattr(value, "verify_token") else value()
    if not hasattr(verifier, "verify_token"):
        raise ConfigurationError(f"--token-verifier {spec}: not a TokenVerifier (no verify_token)")
    return verifier


def _serve_http(client: Any, config: Any, verifier: Any, host: str, port: int) -> None:
    import uvicorn

    from toolfleet.producer.mcp import http_app

    app = http_app(client, config, token_verifier=verifier, host=host)
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    )
    asyncio.run(server.serve())
