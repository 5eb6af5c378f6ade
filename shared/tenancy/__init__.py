"""Many tenants, one fleet: the rules producer and worker share about accounts and tools.

- :mod:`.lanes`: fair scheduling. Each queue is split into lanes that accounts hash
  into (shuffle sharding); workers take from the lanes round-robin.
- :mod:`.quotas`: per-account (and per account and function) quotas on calls in flight
  and calls per second, checked atomically in Redis when a call is published.
- :mod:`.enqueue`: the one Lua script that admits a call under its quotas and enqueues
  it on its lane.
"""
