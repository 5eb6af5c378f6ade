"""A producer process for the shared-affinity tests: one client, calls read from stdin.

``python repl_producer.py URL NAMESPACE sync|async`` reads one JSON object per line,
``{"code": ..., "context": {...}}``, calls ``ext_python_run`` with it through its own
``ToolClient`` (or ``AsyncToolClient``), and prints the result as one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from toolfleet.producer import AsyncToolClient, ToolClient

PYTHON = "ext_python_run"


def _line(result: Any) -> str:
    return json.dumps(
        {"status": result.status.value, "content": result.content, "worker": result.worker}
    )


def main() -> None:
    url, ns, kind = sys.argv[1:]
    if kind == "sync":
        with ToolClient(url, namespace=ns) as client:
            for line in sys.stdin:
                ask = json.loads(line)
                result = client.call(
                    PYTHON, {"code": ask["code"]}, context=ask["context"], timeout_s=30
                )
                print(_line(result), flush=True)
        return

    async def run() -> None:
        async with AsyncToolClient(url, namespace=ns) as client:
            loop = asyncio.get_running_loop()
            while line := await loop.run_in_executor(None, sys.stdin.readline):
                ask = json.loads(line)
                result = await client.call(
                    PYTHON, {"code": ask["code"]}, context=ask["context"], timeout_s=30
                )
                print(_line(result), flush=True)

    asyncio.run(run())


if __name__ == "__main__":
    main()
