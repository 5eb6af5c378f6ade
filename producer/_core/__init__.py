"""The producer's sans-IO core: every decision both clients make, with no socket and no wait.

``ToolClient`` (threads) and ``AsyncToolClient`` (asyncio) are thin shells over it: they
open connections, block or await, and run timers; what to do is decided here, once.

- :mod:`.config`: the constructor arguments checked into one :class:`ClientConfig`.
- :mod:`.calls`: build a request, admit or refuse it, classify a publish error.
- :mod:`.steps`: ``submit``, a turn and ``cancel`` as generators of I/O steps
  (:class:`ReadCatalog`, :class:`TakeSlot`, :class:`Publish`, :class:`MarkResolved`,
  :class:`ForeignCancel`) that a shell performs and answers.
- :mod:`.pending`: the pending-call table (one deadline heap), reply delivery, expiry.
- :mod:`.fleet`: the Redis commands of a cancel and of a call resolved by this client.
- :mod:`.observe`: hooks and metrics fired as calls are listed and resolve.
"""
