"""The one place Redis clients are made, with one timeout policy.

Without timeouts a client waits forever on a Redis that stopped answering; every process survives a Redis
outage by timing out and keeping its last-known state. Agents wait at most 2 s (their loops must move on); an
operator's command may wait longer for an answer worth having.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.settings import Settings

if TYPE_CHECKING:  # imported when a client is made: redis-py loads its asyncio client too (~0.1 s of a command)
    import redis

AGENT_TIMEOUTS_S = (2.0, 2.0)  # (reply, connect)
COMMAND_TIMEOUTS_S = (5.0, 3.0)


def make_redis(settings: Settings, *, command: bool = False) -> redis.Redis:
    """A client for `settings.redis.address`; `command`: an operator's command rather than a long-running agent."""
    import redis

    reply, connect = COMMAND_TIMEOUTS_S if command else AGENT_TIMEOUTS_S
    return redis.Redis.from_url(settings.redis.address, socket_timeout=reply, socket_connect_timeout=connect)
