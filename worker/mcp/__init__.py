"""MCP servers as extensions: the worker is the MCP client of each server a manifest declares.

Process model: every worker process opens its own session to each MCP extension's
server, so a pod running ``toolfleet worker -p N`` runs N processes of each stdio
server (none for a Streamable HTTP server, which runs elsewhere). A server's calls then
fail and recover with the one worker process that owns it, no cross-process traffic sits
on a call's path, and the server process dies with its worker (parent-death signal).

- :mod:`.connection`: one supervised session (start, call, restart with backoff, close).
- :mod:`.servers`: the sessions of one worker process, their loop thread, their targets.
- :mod:`.tools`: MCP tools as tool specs; MCP results as the JSON the model reads.
- :mod:`.launch`: the launcher that ties a stdio server's life to its worker.
"""
