"""A producer process for the idempotency tests: submit one call N times under one key.

``python idempotent_producer.py URL NAMESPACE sync|async KEY PATH N GO_FILE`` waits until
GO_FILE exists (so that two processes race), submits ``ext_once_record`` N times at once,
each with ``idempotency_key=KEY``, and prints one JSON line per result.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from toolfleet.producer import AsyncToolClient, ToolClient

RECORD = "ext_once_record"


def _line(result: Any) -> str:
    return json.dumps(
        {
            "id": result.id,
            "status": result.status.value,
            "content": result.content,
            "duplicate_of": result.duplicate_of,
        }  # fmt: skip
    )


def _wait(go: Path) -> None:
    while not go.exists():
        time.sleep(0.005)


def main() -> None:
    url, ns, kind, key, path, count, go = sys.argv[1:]
    arguments = {"path": path, "hold_s": 1.0}
    context = {"account": "acme"}
    if kind == "sync":
        with ToolClient(url, namespace=ns) as client:
            client.tools()  # connected and the catalog read before the race
            _wait(Path(go))
            futures = [
                client.submit(
                    RECORD, arguments, context=context, timeout_s=30, idempotency_key=key
                )  # fmt: skip
                for _ in range(int(count))
            ]
            for future in futures:
                print(_line(future.result()), flush=True)
        return

    async def run() -> None:
        async with AsyncToolClient(url, namespace=ns) as client:
            await client.tools()
            _wait(Path(go))
            calls = [
                client.call(
                    RECORD, arguments, context=context, timeout_s=30, idempotency_key=key
                )  # fmt: skip
                for _ in range(int(count))
            ]
            for result in await asyncio.gather(*calls):
                print(_line(result), flush=True)

    asyncio.run(run())


if __name__ == "__main__":
    main()
