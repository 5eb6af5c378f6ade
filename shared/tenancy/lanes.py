"""Fair scheduling across accounts: per-queue lanes, shuffle-sharded, taken round-robin.

Why lanes, and why this shape (on Dramatiq's Redis layout):

- Dramatiq keeps one list per queue (``<ns>:<queue>``, message ids) and one hash of
  bodies (``<queue>.msgs``); a worker pops the list's head. One account's flood of 5,000
  calls therefore queues every other account behind it.
- Each queue gets :data:`LANES` lane lists (``<ns>:<queue>.lane.<i>``) holding the
  message ids; the queue list itself holds one :data:`TOKEN` per message waiting in a
  lane. Beside them, ``<ns>:<queue>.lanes-active`` (the rotation) lists the numbers of
  the non-empty lanes, each once: a push that makes a lane non-empty appends its number.
  A worker's fetch pops a token, then the lane at the rotation's head, takes that lane's
  head and appends the lane's number again if the lane still holds ids: every lane with
  work is served in turn, and finding it costs O(1) commands however many lanes are
  empty (scanning them cost up to :data:`LANES` lane pops). The invariant, kept
  atomically by every script that pushes to or pops from a lane (the enqueue script and
  the fetch; nothing else touches lanes): a lane is non-empty iff its number is in the
  rotation exactly once. A stale number (its lane emptied behind the scripts' back) is
  dropped; an empty rotation while a token waits is rebuilt from the lanes' lengths.
- An account's calls go to the shorter of its two lanes (:func:`shard_for`: shuffle
  sharding, as in AWS's Route 53 design): a flood fills its own two lanes, and another
  account shares *both* of its lanes with it only with probability ``1 / C(16, 2)``
  (1 in 120); sharing one lane, it uses the other. Per-account lists would be exactly
  fair but make the number of Redis keys, scanned lanes and metric series grow with the
  number of accounts; lanes keep all three bounded.
- Everything Dramatiq and toolfleet already do keeps working: bodies stay in
  ``<queue>.msgs`` (so queue depth, KEDA's trigger, ``toolfleet top`` and the
  backpressure limit still read ``HLEN`` of one hash per queue); messages put back by
  Dramatiq's maintenance, by recovery or by a closing consumer go to the queue list as
  plain ids, which the fetch takes as before (first, since they were fetched first); a
  worker still blocks on the one queue list while it is empty. A message enqueued by
  plain Dramatiq (no lanes) is served too.

Per-account weights are not offered. A lane is shared by the accounts that hash into
it and lanes are served one message each in turn, so a weight could only be a lane's,
and weighting a lane favours every account sharing it, not the one weighted; weighting
the account itself needs per-account state in the fetch, which is what lanes avoid.
An account that must get more (or less) of the fleet is given it with quotas
(:mod:`.quotas`: calls in flight, calls per second).

Slot queues of session affinity carry one conversation each and use no lanes.
"""

from __future__ import annotations

import functools
import hashlib

from toolfleet.shared.naming import lane_key, lanes_active_key

__all__ = [
    "LANES",
    "TOKEN",
    "lane_key",
    "lane_keys",
    "lanes_active_key",
    "shard_for",
    "uses_lanes",
]

#: Lanes per queue. Producer and worker must agree (the fetch scans this many).
LANES = 16
#: What the queue list holds for a message waiting in a lane (never a message id: those
#: are UUIDs).
TOKEN = "*"


def lane_keys(namespace: str, queue: str) -> list[str]:
    """Every lane list of ``queue``, lane 0 first."""
    return [lane_key(namespace, queue, lane) for lane in range(LANES)]


@functools.lru_cache(maxsize=4096)
def shard_for(account: str | None) -> tuple[int, int]:
    """The two distinct lanes ``account`` may use (``None`` and ``""`` share one shard).

    A stable hash (SHA-256, not Python's salted ``hash``) so that every producer process
    agrees; the recent accounts' shards are remembered (a call pays a dict look-up).
    """
    digest = int.from_bytes(hashlib.sha256((account or "").encode()).digest()[:8], "big")
    first = digest % LANES
    second = (digest // LANES) % (LANES - 1)
    return first, second + 1 if second >= first else second


def uses_lanes(queue: str) -> bool:
    """Whether calls to ``queue`` go through lanes (not a session-affinity slot queue)."""
    return ".slot." not in queue
