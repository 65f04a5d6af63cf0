"""Python client for Permit, a distributed semaphore and work-queue service.

Blocking API here (threads); the same API with ``async``/``await`` in :mod:`permit.aio`.

Example::

    import permit

    client = permit.Client("http://127.0.0.1:7376")
    with client.session(ttl=10.0) as session:
        with session.acquire("gpu", capacity=8) as p:
            print(p.token)
"""

from ._common import (
    KEEP,
    DelayedPermits,
    Event,
    GroupInfo,
    Holder,
    ItemInfo,
    Leader,
    NewItem,
    Pushed,
    QueueInfo,
    Rate,
    RateInfo,
    SemaphoreInfo,
    Waiter,
)
from ._errors import (
    CODES,
    AlreadyHeld,
    AuthError,
    ClusterUnavailable,
    Conflict,
    InternalError,
    InvalidRequest,
    LimitExceeded,
    NotFound,
    PermitError,
    RateLimited,
    SessionForked,
    SessionLost,
    Timeout,
    Unavailable,
)
from ._sync import Client, EventStream, Item, LeaderWatch, Leadership, Permit, Session
from ._sync_io import close_sessions_on_sigterm

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Session",
    "Permit",
    "Leadership",
    "Item",
    "SemaphoreInfo",
    "Holder",
    "Waiter",
    "Rate",
    "RateInfo",
    "DelayedPermits",
    "GroupInfo",
    "KEEP",
    "Leader",
    "QueueInfo",
    "ItemInfo",
    "Pushed",
    "NewItem",
    "Event",
    "LeaderWatch",
    "EventStream",
    "close_sessions_on_sigterm",
    "PermitError",
    "InvalidRequest",
    "NotFound",
    "Conflict",
    "Unavailable",
    "AlreadyHeld",
    "LimitExceeded",
    "RateLimited",
    "AuthError",
    "ClusterUnavailable",
    "InternalError",
    "Timeout",
    "SessionLost",
    "SessionForked",
    "CODES",
]
