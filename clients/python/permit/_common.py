"""What the sync and asyncio clients share: endpoints, the retry policy, answers and views."""

from __future__ import annotations

import json
import os
import random
import socket
import ssl
import threading
import time
import traceback
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple, Type, Union
from urllib.parse import quote, urlsplit

import httpx

from ._errors import (
    AlreadyHeld,
    ClusterUnavailable,
    InternalError,
    LimitExceeded,
    PermitError,
    SessionForked,
    error_for,
)

#: Client-side timeout of a request that does not long-poll (seconds).
REQUEST_TIMEOUT = 10.0
#: Extra time a long-poll is given beyond the wait it asks the server for.
LONG_POLL_MARGIN = 5.0
#: Longest wait asked of the server in one acquire or campaign; the loop repeats the call.
WAIT_CHUNK = 30.0
#: Attempts of a retried call, over all endpoints.
ATTEMPTS_MAX = 24
#: Longest a retried call keeps retrying after its first failure: rides out a leader
#: election (about 2 s).
RETRY_WINDOW = 6.0
#: Attempts that may time out before a retried call gives up.
TIMEOUTS_MAX = 2
#: First pause before going around the endpoints again; doubles up to BACKOFF_MAX.
BACKOFF_MIN = 0.05
BACKOFF_MAX = 1.0
#: Pause between keepalive retries while in jeopardy: ttl/10 within these bounds.
RETRY_PAUSE_MIN = 0.01
RETRY_PAUSE_MAX = 1.0
#: Shortest client-side timeout of one keepalive.
KEEPALIVE_TIMEOUT_MIN = 0.1

#: Retry policies: any harmless repeat; only requests certainly not applied; one pass, no pause.
IDEMPOTENT = "idempotent"
UNSENT = "unsent"
ONE_PASS = "one_pass"

EndpointsArg = Union[str, Sequence[str]]

#: The endpoint used when neither the ``endpoints`` argument nor ``PERMIT_SERVER`` names one
#: (the CLI's default too).
DEFAULT_ENDPOINT = "http://127.0.0.1:7376"


def _env(name: str) -> Optional[str]:
    # An empty variable counts as unset, as it does for the CLI (clap).
    value = os.environ.get(name)
    return value if value else None


@dataclass(frozen=True)
class Settings:
    """A client's endpoints and credentials: each explicit argument, else the environment
    variable the ``permit`` CLI reads for it, else the default."""

    endpoints: List[str]
    auth_token: Optional[str]
    ca_file: Optional[str]
    cert_file: Optional[str]
    key_file: Optional[str]


def settings(
    endpoints: Optional[EndpointsArg],
    auth_token: Optional[str],
    ca_file: Optional[str],
    cert_file: Optional[str],
    key_file: Optional[str],
) -> Settings:
    """Fills what was not given from ``PERMIT_SERVER`` (comma-separated URLs),
    ``PERMIT_AUTH_TOKEN``, ``PERMIT_CA_FILE``, ``PERMIT_CLIENT_CERT`` and ``PERMIT_CLIENT_KEY``,
    the variables of the CLI's ``--server``, ``--auth-token``, ``--ca-file``, ``--client-cert``
    and ``--client-key``. An explicit argument always wins over the environment. The client
    certificate and key come from the environment only as a pair, and only when neither was
    given explicitly (a half from each place would be a mismatched pair)."""
    if endpoints is None:
        endpoints = _env("PERMIT_SERVER") or DEFAULT_ENDPOINT
    if auth_token is None:
        auth_token = _env("PERMIT_AUTH_TOKEN")
    if ca_file is None:
        ca_file = _env("PERMIT_CA_FILE")
    if cert_file is None and key_file is None:
        cert_file, key_file = _env("PERMIT_CLIENT_CERT"), _env("PERMIT_CLIENT_KEY")
        if (cert_file is None) != (key_file is None):
            raise ValueError("PERMIT_CLIENT_CERT and PERMIT_CLIENT_KEY must be set together")
    return Settings(normalize_endpoints(endpoints), auth_token, ca_file, cert_file, key_file)


def normalize_endpoints(endpoints: EndpointsArg) -> List[str]:
    """``scheme://host:port`` for each endpoint; a bare ``host:port`` gets ``http://``."""
    urls = [endpoints] if isinstance(endpoints, str) else list(endpoints)
    urls = [part for url in urls for part in url.split(",") if part.strip()]
    if not urls:
        raise ValueError("no endpoint given")
    out = []
    for url in urls:
        text = url.strip()
        if "://" not in text:
            text = "http://" + text
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"{url!r}: only http:// and https:// endpoints are supported")
        if not parts.hostname:
            raise ValueError(f"{url!r}: no host")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"{url!r}: give only the scheme, host and port")
        if parts.username or parts.password:
            raise ValueError(f"{url!r}: credentials in the URL are not supported")
        out.append(f"{parts.scheme}://{parts.netloc}")
    return out


def leader_hint(endpoints: List[str], current: int, response: Any) -> int:
    """The index of the endpoint to prefer after the successful ``response``: the one its
    ``permit-leader`` header names (the leader's URL; a follower would forward requests there,
    one HTTP hop more) when it is one of ``endpoints``, else ``current``. Unknown addresses are
    ignored: the client talks only to the endpoints it was given. Only successful answers are
    followed: a follower that cannot reach a leader that died names it until an election."""
    if len(endpoints) < 2:
        return current
    hint = response.headers.get("permit-leader")
    if not hint:
        return current
    try:
        (leader,) = normalize_endpoints(hint)
    except ValueError:
        return current
    try:
        return endpoints.index(leader)
    except ValueError:
        return current


def segment(name: str) -> str:
    """``name`` as one URL path segment, so a bad name reaches the server (which refuses it)."""
    return quote(name, safe="-._~:")


def httpx_options(
    auth_token: Optional[str],
    ca_file: Optional[str],
    cert_file: Optional[str],
    key_file: Optional[str],
    verify: Union[bool, str, ssl.SSLContext, None],
    headers: Optional[Dict[str, str]],
) -> Dict[str, Any]:
    """Keyword arguments for ``httpx.Client`` / ``httpx.AsyncClient`` (``transport``: those of
    its transport): auth header, TLS, pool limits, TCP_NODELAY."""
    all_headers: Dict[str, str] = dict(headers or {})
    if auth_token:
        all_headers["Authorization"] = f"Bearer {auth_token}"
    tls: Union[bool, ssl.SSLContext] = True
    if isinstance(verify, ssl.SSLContext):
        tls = verify
    elif verify is False:
        tls = False
    elif ca_file or cert_file or isinstance(verify, str):
        context = ssl.create_default_context(cafile=ca_file or (verify if isinstance(verify, str) else None))
        if cert_file:
            context.load_cert_chain(cert_file, key_file)
        tls = context
    return {
        "headers": all_headers,
        "trust_env": False,
        "transport": {
            "verify": tls,
            # Idle connections are dropped before the server's 10 s header-read timeout.
            "limits": httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=4.0),
            # Small requests are sent at once (headers and body may be separate writes).
            "socket_options": [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        },
    }


def ms(seconds: float) -> int:
    """Seconds as whole milliseconds, rounded up so a short wait still waits."""
    return max(0, int(-(-seconds * 1000 // 1)))


class Failure(Exception):
    """One failed attempt, and whether the server certainly did not apply it."""

    def __init__(self, error: PermitError, unsent: bool, timed_out: bool = False) -> None:
        super().__init__(str(error))
        self.error = error
        self.unsent = unsent
        self.timed_out = timed_out

    def retryable(self, policy: str) -> bool:
        if policy in (UNSENT, ONE_PASS):
            return self.unsent
        return (
            self.unsent
            or self.timed_out
            or self.error.code in ("connection", "timeout", "no_leader", "shutting_down")
        )


def transport_failure(endpoint: str, error: Exception) -> Failure:
    """A failure without an answer: refused connections were certainly not applied. A TLS
    failure (certificate not trusted, client certificate refused) is not retried: it would
    fail the same way again."""
    cause: Optional[BaseException] = error
    while cause is not None:
        if isinstance(cause, ssl.SSLError):
            return Failure(ClusterUnavailable("tls", 0, f"{endpoint}: TLS failed: {cause}"), False)
        cause = cause.__cause__ or cause.__context__
    unsent = isinstance(error, httpx.ConnectError)
    timed_out = isinstance(error, httpx.TimeoutException) and not isinstance(error, httpx.ConnectTimeout)
    unsent = unsent or isinstance(error, httpx.ConnectTimeout)
    return Failure(ClusterUnavailable("connection", 0, f"{endpoint}: {type(error).__name__}: {error}"), unsent, timed_out)


def answer_failure(endpoint: str, response: httpx.Response) -> Failure:
    """A non-2xx answer as an error; only ``leader_unreachable`` and ``storage_error`` prove
    that nothing was done."""
    try:
        body = response.json()
        code = str(body["error"]["code"])
        message = str(body["error"]["message"])
    except (ValueError, KeyError, TypeError):
        error: PermitError = InternalError(
            "protocol", response.status_code, f"{endpoint}: unexpected answer {response.text[:200]!r}"
        )
        return Failure(error, False)
    error = error_for(code, response.status_code, message)
    if isinstance(error, LimitExceeded):
        # The body's ``retry_after_ms`` (``rate_limited``) is exact; the header is whole seconds.
        retry_after_ms = body["error"].get("retry_after_ms")
        if isinstance(retry_after_ms, (int, float)) and not isinstance(retry_after_ms, bool):
            error.retry_after = retry_after_ms / 1000.0
        else:
            try:
                error.retry_after = float(response.headers.get("retry-after", ""))
            except ValueError:
                pass
    return Failure(error, code in ("leader_unreachable", "storage_error"))


def decode(endpoint: str, response: httpx.Response) -> Any:
    if response.status_code == 204 or not response.content:
        return None
    try:
        return json.loads(response.content)
    except ValueError as error:
        raise InternalError("protocol", response.status_code, f"{endpoint}: cannot decode the body: {error}")


class Attempts:
    """The retry loop's bookkeeping: when to give up and how long to pause."""

    def __init__(self, policy: str, endpoints: int) -> None:
        self.policy = policy
        self.endpoints = endpoints
        self.max = endpoints if policy == ONE_PASS else max(ATTEMPTS_MAX, endpoints)
        self.count = 0
        self.timeouts = 0
        # The retry window opens at the first failure, not at the send: a long-poll that fails
        # after waiting 30 s still gets its few seconds of failover.
        self.first_failure: Optional[float] = None
        self.backoff = BACKOFF_MIN

    def after(self, failure: Failure, index: int) -> Optional[float]:
        """``None`` to give up, else the pause before the next attempt (on the next endpoint)."""
        self.count += 1
        if self.first_failure is None:
            self.first_failure = time.monotonic()
        if failure.timed_out:
            self.timeouts += 1
        exhausted = (
            self.count >= self.max
            or time.monotonic() - self.first_failure >= RETRY_WINDOW
            or (self.policy != ONE_PASS and self.timeouts >= TIMEOUTS_MAX)
        )
        if exhausted or not failure.retryable(self.policy):
            return None
        nxt = (index + 1) % self.endpoints
        if self.policy != ONE_PASS and (nxt == 0 or self.endpoints == 1):
            pause = self.backoff * (0.5 + random.random())
            self.backoff = min(self.backoff * 2, BACKOFF_MAX)
            return pause
        return 0.0


def retry_pause(ttl: float) -> float:
    return min(max(ttl / 10, RETRY_PAUSE_MIN), RETRY_PAUSE_MAX)


def keepalive_timeout(left: float, endpoints: int) -> float:
    return min(max(left / max(endpoints, 1), KEEPALIVE_TIMEOUT_MIN), REQUEST_TIMEOUT)


def check_pid(pid: int, session_id: str) -> None:
    if os.getpid() != pid:
        raise SessionForked(
            "session_forked",
            0,
            f"session {session_id} belongs to process {pid}; this process ({os.getpid()}) is a "
            "fork of it and must not use, keep alive or close it: open a new session here",
        )


@dataclass(frozen=True)
class Holder:
    """A holder of a semaphore: its session id, permits, fencing token and the ``group`` its
    acquire named (``None`` if none).

    Example::

        for h in client.semaphore("gpu").holders:
            print(h.session, h.permits, h.token, h.group)
    """

    session: str
    permits: int
    token: int
    session_name: Optional[str] = None
    group: Optional[str] = None


@dataclass(frozen=True)
class Waiter:
    """A queued acquire of a semaphore, with its 1-based position and ``group``; ``take`` is
    true for a waiting :meth:`Client.take` (then ``session`` is the take's own id, not a
    session's).

    Example::

        [w.position for w in client.semaphore("gpu").waiters]   # [1, 2, ...]
    """

    session: str
    permits: int
    position: int
    session_name: Optional[str] = None
    group: Optional[str] = None
    take: bool = False


#: Longest wait the server gives one take; a longer ``timeout`` asks again.
TAKE_WAIT_MAX = 60.0
#: Pause before asking again after a take refused early without a ``retry_after``.
TAKE_PAUSE = 0.1


@dataclass(frozen=True)
class Rate:
    """A rate next to a semaphore's capacity: ``permits`` per ``per`` seconds sustained, at
    most ``burst`` at once after a quiet spell (default ``permits``). Permits granted by
    acquires and takes both count. The server decides on the leader's clock, so clients'
    clocks never matter. ``per`` is sent in whole milliseconds (1 ms to a day).

    Example::

        client.set_capacity("openai", 4, rate=permit.Rate(60, per=60.0, burst=10))
    """

    permits: int
    per: float = 1.0
    burst: Optional[int] = None


def rate_body(rate: Rate) -> Dict[str, Any]:
    """The rate as ``PUT /v1/semaphores/{name}`` takes it."""
    # Rounded to the nearest millisecond: the period is a setting, not a wait, and a float
    # like 0.1 * 3 must not become 301 ms.
    per_ms = round(rate.per * 1000)
    if per_ms < 1:
        raise ValueError(f"a rate's period is at least 1 ms, not {rate.per!r} s")
    body: Dict[str, Any] = {"permits": rate.permits, "per_ms": per_ms}
    if rate.burst is not None:
        body["burst"] = rate.burst
    return body


@dataclass(frozen=True)
class RateInfo:
    """A semaphore's rate as the server reads it now: the setting (``permits`` per ``per``
    seconds, ``burst``), the permits it would grant now (``available``, 0..burst) and the
    seconds until it allows one more (``next_in``, 0 when ``available`` > 0).

    Example::

        rate = client.semaphore("api.quota").rate
        if rate is not None and rate.available == 0:
            print("next permit in", rate.next_in, "s")
    """

    permits: int
    per: float
    burst: int
    available: int
    next_in: float


@dataclass(frozen=True)
class DelayedPermits:
    """Permits of a failed hold (ended by its session's expiry or a revoke, not a release)
    that the lock-delay keeps out of circulation: they return at leader time ``until_ms``,
    ``remaining`` seconds from the read.

    Example::

        for d in client.semaphore("gpu").delayed:
            print(d.permits, "permits back in", d.remaining, "s")
    """

    permits: int
    until_ms: int
    remaining: float


@dataclass(frozen=True)
class GroupInfo:
    """One group of a semaphore (the ``group`` of acquires): the permits its holders hold, its
    holders and its waiting acquires.

    Example::

        for g in client.semaphore("gpu").groups:
            print(g.group, g.held, g.holders, g.waiters)
    """

    group: str
    held: int
    holders: int
    waiters: int


@dataclass(frozen=True)
class SemaphoreInfo:
    """A semaphore as the server sees it now (a linearizable read): capacity, ``held``,
    ``available`` (capacity less held and delayed permits), holders and waiters, and its
    policies: ``rate`` (a :class:`RateInfo`, ``None`` without one), ``lock_delay`` (seconds,
    0 for none), the ``delayed`` permits of failed holds, ``group_max`` (``None`` without a
    cap) and the ``groups`` that hold or wait.

    Example::

        info = client.semaphore("gpu")
        print(info.capacity, info.available, len(info.holders), len(info.waiters))
    """

    name: str
    capacity: int
    held: int
    available: int
    holders: Tuple[Holder, ...]
    waiters: Tuple[Waiter, ...]
    index: int
    rate: Optional[RateInfo] = None
    lock_delay: float = 0.0
    delayed: Tuple[DelayedPermits, ...] = ()
    group_max: Optional[int] = None
    groups: Tuple[GroupInfo, ...] = ()


class _Keep(Enum):
    KEEP = "keep"

    def __repr__(self) -> str:
        return "permit.KEEP"


#: The default of :meth:`Client.set_capacity`'s policies: the semaphore keeps what it has
#: (``None`` removes the policy instead).
KEEP = _Keep.KEEP


def put_semaphore_body(
    capacity: int,
    rate: Union[Rate, None, _Keep],
    lock_delay: Union[float, None, _Keep],
    group_max: Union[int, None, _Keep],
) -> Dict[str, Any]:
    """The ``PUT /v1/semaphores/{name}`` request: a policy left at :data:`KEEP` is absent (the
    server keeps it), ``None`` removes it (``null``; a lock-delay of 0)."""
    body: Dict[str, Any] = {"capacity": capacity}
    if rate is not KEEP:
        body["rate"] = None if rate is None else rate_body(rate)
    if lock_delay is not KEEP:
        body["lock_delay_ms"] = 0 if lock_delay is None else ms(lock_delay)
    if group_max is not KEEP:
        body["group_max"] = group_max
    return body


class Leader(NamedTuple):
    """The leader of an election: ``(session, value, token)``.

    Example::

        leader = client.leader("scheduler")
        if leader is not None:
            session, value, token = leader
    """

    session: str
    value: str
    token: int


def semaphore_info(body: Any) -> SemaphoreInfo:
    # The policy fields are absent from the answers of servers older than them.
    rate = body.get("rate")
    return SemaphoreInfo(
        name=body["name"],
        capacity=body["capacity"],
        held=body["held"],
        available=body["available"],
        holders=tuple(
            Holder(h["session"], h["permits"], h["token"], h.get("session_name"), h.get("group"))
            for h in body["holders"]
        ),
        waiters=tuple(
            Waiter(
                w["session"], w["permits"], w["position"], w.get("session_name"), w.get("group"), bool(w.get("take", False))
            )
            for w in body["waiters"]
        ),
        index=body["index"],
        rate=None
        if rate is None
        else RateInfo(rate["permits"], rate["per_ms"] / 1000.0, rate["burst"], rate["available"], rate["next_in_ms"] / 1000.0),
        lock_delay=body.get("lock_delay_ms", 0) / 1000.0,
        delayed=tuple(DelayedPermits(d["permits"], d["until_ms"], d["remaining_ms"] / 1000.0) for d in body.get("delayed", ())),
        group_max=body.get("group_max"),
        groups=tuple(GroupInfo(g["group"], g["held"], g["holders"], g["waiters"]) for g in body.get("groups", ())),
    )


def leader_of(body: Any) -> Optional[Leader]:
    leader = body.get("leader")
    if not leader:
        return None
    return Leader(leader["session"], leader["value"], leader["token"])


def acquire_body(
    session: str,
    permits: int,
    wait: float,
    capacity: Optional[int],
    max_hold: Optional[float],
    ephemeral: bool,
    group: Optional[str] = None,
) -> Dict[str, Any]:
    """The acquire request; ``ephemeral`` matters only when ``capacity`` creates the semaphore
    (the server then deletes it when its last holder and waiter leave, as the CLI's semaphores
    made with ``--capacity`` and without ``--keep``)."""
    body: Dict[str, Any] = {"session": session, "permits": permits, "wait_ms": ms(wait)}
    if capacity is not None:
        body["capacity"] = capacity
    if max_hold is not None:
        body["max_hold_ms"] = ms(max_hold)
    if ephemeral and capacity is not None:
        body["ephemeral"] = True
    if group is not None:
        body["group"] = group
    return body


def take_slice(deadline: Optional[float], try_once: bool) -> float:
    """How long the next take asks the server to wait: at most ``TAKE_WAIT_MAX``; 0 to try
    once, else at least 1 ms so that it waits."""
    if try_once:
        return 0.0
    chunk = TAKE_WAIT_MAX
    if deadline is not None:
        chunk = min(chunk, deadline - time.monotonic())
    return max(chunk, 0.001)


# Pauses between the asks of a blocked acquire or campaign while the cluster is unavailable
# (after the request's own retries): from the first, doubling up to the last, until the session's
# local deadline. The server keeps a queue place as long as its session lives.
OUTAGE_PAUSE_MIN = 0.1
OUTAGE_PAUSE_MAX = 1.0


def wait_slice(deadline: Optional[float], try_once: bool, ttl: float) -> float:
    """How long the next long-poll asks the server to wait: at most WAIT_CHUNK and one TTL, so
    a session lost meanwhile is noticed; at least 1 ms so that it waits rather than tries."""
    if try_once:
        return 0.0
    chunk = min(WAIT_CHUNK, max(ttl, 1.0))
    if deadline is not None:
        chunk = min(chunk, deadline - time.monotonic())
    return max(chunk, 0.001)


# Most session ids in one batched keepalive (``permit_wire::KEEPALIVE_BATCH_MAX``).
KEEPALIVE_BATCH_MAX = 1024

# The HTTP status of each error a batched keepalive can answer for one session.
_ITEM_STATUS = {"session_not_found": 404, "permission_denied": 403}


def keepalive_results(ids: Sequence[str], body: Any) -> "Dict[str, Union[float, PermitError]]":
    """Maps each id of a batched keepalive to its TTL in seconds (renewed) or its error."""
    results = body.get("sessions") if isinstance(body, dict) else None
    if not isinstance(results, list) or [r.get("id") for r in results] != list(ids):
        raise PermitError("protocol", 200, "the batched keepalive's results do not match the ids sent")
    out: Dict[str, Union[float, PermitError]] = {}
    for result in results:
        if "ttl_ms" in result:
            out[result["id"]] = result["ttl_ms"] / 1000.0
        else:
            code, message = result["error"]["code"], result["error"]["message"]
            out[result["id"]] = error_for(code, _ITEM_STATUS.get(code, 200), message)
    return out


# How long keepalives go one per session after the server answered the batch route 404/405,
# before the route is tried again (the cluster may have been upgraded meanwhile).
BATCH_ROUTE_RETRY = 60.0
# Longest a batch waits, when it departs, for the sessions it woke to join it (see ``depart``).
RIDE_WAIT = 0.005


class Renewal(NamedTuple):
    """An acknowledged keepalive: when the request carrying it was sent (``time.monotonic()``),
    and the TTL the server renewed it for (seconds)."""

    sent: float
    ttl: float


#: A background keepalive's outcome: renewed, or the error (shared by a failed batch's asks).
Outcome = Union[Renewal, PermitError]


class KeepaliveAsk:
    """One session's ask to be kept alive by the next batch. ``unsupported`` once settled means
    the server has no batch route: the session sends its keepalive alone. The sync and asyncio
    clients subclass it with the way the asking thread or task is woken (``_notify``)."""

    def __init__(self, session_id: str, timeout: float) -> None:
        self.session_id = session_id
        self.timeout = timeout
        self.outcome: Optional[Outcome] = None
        self.unsupported = False
        # The session stopped waiting (its deadline passed or it was stopped): not sent.
        self.abandoned = False

    def settle(self, outcome: Optional[Outcome]) -> None:
        if outcome is None:
            self.unsupported = True
        self.outcome = outcome
        self._notify()

    def _notify(self) -> None:
        raise NotImplementedError


def lacks_batch_route(error: PermitError) -> bool:
    """Whether ``error`` is an older server's answer to the batch route it does not have: 405
    (the path matched ``/v1/sessions/{id}``) or a 404 other than ``session_not_found``."""
    return error.status == 405 or (error.status == 404 and error.code != "session_not_found")


class KeepaliveBatcher:
    """Group commit of one client's background keepalives (the I/O is the sync or asyncio
    client's): a session asking for one is sent at once when no batch is in flight; asks that
    come while one is in flight wait and all go in the next request (``POST
    /v1/sessions/keepalive``, up to ``KEEPALIVE_BATCH_MAX`` ids each) when it returns. Healthy
    sessions past half their keepalive period register as riders and are woken when a batch
    departs, so that the sessions of one client fall into step and share their requests. A
    server without the batch route (404/405) gets one request per session for
    ``BATCH_ROUTE_RETRY`` seconds, then the route is tried again. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._asks: List[KeepaliveAsk] = []
        # A sender is running; it takes every ask queued before it stops.
        self._sending = False
        self._unbatched_until: Optional[float] = None
        self._riders: Dict[int, Callable[[], None]] = {}
        self._joined = 0

    def _forked(self) -> None:
        # A forked child has no sender thread: it starts afresh (called with the lock held).
        if self._pid != os.getpid():
            self._reset()

    def unbatched(self) -> bool:
        """Whether keepalives go one per session for now."""
        with self._lock:
            self._forked()
            until = self._unbatched_until
        return until is not None and time.monotonic() < until

    def put(self, ask: KeepaliveAsk) -> bool:
        """Queues ``ask``; true when the caller must start a sender (none is running)."""
        with self._lock:
            self._forked()
            self._asks.append(ask)
            self._joined += 1
            self._lock.notify_all()
            start = not self._sending
            self._sending = True
            return start

    def ride(self, key: int, wake: Callable[[], None]) -> None:
        """Calls ``wake`` (once) when the next batch departs, unless ``unride`` comes first."""
        with self._lock:
            self._forked()
            self._riders[key] = wake

    def unride(self, key: int) -> None:
        with self._lock:
            self._riders.pop(key, None)

    def depart(self) -> int:
        """Wakes the riders as a batch is about to be taken; returns how many asks to wait for
        (with ``wait_joined``) so that they join this batch rather than the next one."""
        with self._lock:
            riders = list(self._riders.values())
            self._riders.clear()
            self._joined = 0
        for wake in riders:
            wake()
        return len(riders)

    def wait_joined(self, count: int, timeout: float = RIDE_WAIT) -> None:
        """Blocks until ``count`` asks came since ``depart`` or ``timeout`` passed (threads)."""
        with self._lock:
            self._lock.wait_for(lambda: self._joined >= count, timeout)

    def joined(self) -> int:
        with self._lock:
            return self._joined

    def take(self) -> Optional[List[KeepaliveAsk]]:
        """The next batch's asks, or ``None`` (and the sender stops) when none is left."""
        with self._lock:
            self._asks = [ask for ask in self._asks if not ask.abandoned]
            if not self._asks:
                self._sending = False
                return None
            asks = self._asks[:KEEPALIVE_BATCH_MAX]
            del self._asks[:KEEPALIVE_BATCH_MAX]
            return asks

    def stopped(self, inflight: Sequence[KeepaliveAsk]) -> None:
        """The sender ended abnormally: the asks of its batch in flight and those still queued
        get an error (their sessions go in jeopardy and retry), the next ask starts a new
        sender."""
        with self._lock:
            asks, self._asks, self._sending = self._asks, [], False
        error = InternalError("internal", 0, "the keepalive batcher stopped")
        for ask in [*inflight, *asks]:
            if ask.outcome is None and not ask.unsupported:
                ask.settle(error)

    @staticmethod
    def request(asks: Sequence[KeepaliveAsk]) -> Tuple[List[str], float]:
        """The ids of a batch (an id asked twice, by a session that gave up on an earlier ask,
        is sent once) and its timeout (the shortest of its asks)."""
        ids = list(dict.fromkeys(ask.session_id for ask in asks))
        return ids, min(ask.timeout for ask in asks)

    def settle(
        self, asks: Sequence[KeepaliveAsk], ids: Sequence[str], sent: float, body: Any = None, error: Optional[PermitError] = None
    ) -> None:
        """Settles a batch's asks with its answer ``body`` or ``error``; ``sent`` was taken
        before the request left, so every renewal it carries happened after that instant."""
        if error is None:
            try:
                results = keepalive_results(ids, body)
            except PermitError as bad:
                error = bad
        if error is not None:
            if lacks_batch_route(error):
                with self._lock:
                    self._unbatched_until = time.monotonic() + BATCH_ROUTE_RETRY
            for ask in asks:
                ask.settle(None if lacks_batch_route(error) else error)
            return
        for ask in asks:
            result = results[ask.session_id]
            ask.settle(result if isinstance(result, PermitError) else Renewal(sent, result))

    def unsupported_now(self, asks: Sequence[KeepaliveAsk]) -> bool:
        """Settles ``asks`` as unsupported (asked before an earlier batch found the route
        missing; they go alone without a second batch request) when that is so."""
        if not self.unbatched():
            return False
        for ask in asks:
            ask.settle(None)
        return True


#: Longest an event stream may stay silent before the client presumes the connection dead: the
#: server sends a ``: keepalive`` comment every 15 s.
STREAM_READ_TIMEOUT = 45.0


@dataclass(frozen=True)
class Event:
    """One frame of the event stream (``GET /v1/events``, see ``docs/observability.md``):
    ``id`` is the event's seq on the node that sent it (``None`` on a ``missed`` frame),
    ``kind`` its kind (``granted``, ``released``, ``leader_changed``, ..., or ``missed``),
    ``data`` the decoded ``data:`` JSON.

    Example::

        for event in client.events(prefix="gpu", timeout=60.0):
            print(event.kind, event.data.get("name"))
    """

    id: Optional[int]
    kind: str
    data: Dict[str, Any]


class SseParser:
    """Server-Sent Events, one line at a time (without its line ending): a blank line ends a
    frame, ``:`` lines are comments (the server's keepalives)."""

    def __init__(self) -> None:
        self._id: Optional[str] = None
        self._kind: Optional[str] = None
        self._data: List[str] = []

    def line(self, endpoint: str, line: str) -> Optional[Event]:
        """The frame ``line`` completes, if any."""
        if line == "":
            if not self._data and self._kind is None:
                return None
            raw_id, kind, data = self._id, self._kind or "message", "\n".join(self._data)
            self._id, self._kind, self._data = None, None, []
            try:
                body = json.loads(data) if data else {}
                seq = int(raw_id) if raw_id is not None else None
            except ValueError as error:
                raise InternalError("protocol", 200, f"{endpoint}: a malformed event frame: {error}")
            return Event(seq, kind, body if isinstance(body, dict) else {"data": body})
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "id":
            self._id = value
        elif field == "event":
            self._kind = value
        elif field == "data":
            self._data.append(value)
        return None


def events_params(prefix: Optional[str], kinds: Optional[Sequence[str]], timeout: Optional[float]) -> Dict[str, Any]:
    """The query of ``GET /v1/events``; ``timeout`` becomes ``wait_ms``, so that the server
    ends the stream (cleanly) when it passes."""
    params: Dict[str, Any] = {}
    if prefix:
        params["prefix"] = prefix
    if kinds:
        params["kinds"] = ",".join(kinds)
    if timeout is not None:
        params["wait_ms"] = max(1, ms(timeout))
    return params


class LeaderTracker:
    """The state of a leader watch (``observe_leader``): the blocking read to send next and
    whether an answer is a change worth yielding."""

    _UNSEEN: Any = object()

    def __init__(self, election: str, timeout: Optional[float]) -> None:
        self.path = f"/v1/elections/{segment(election)}"
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.index: Optional[int] = None
        self.last: Any = self._UNSEEN

    def next_read(self) -> Optional[Tuple[Dict[str, Any], float]]:
        """``(params, wait)`` of the next read (no params for the first, plain one), or
        ``None`` once the watch's time is up."""
        if self.index is None:
            return {}, 0.0
        wait = WAIT_CHUNK
        if self.deadline is not None:
            wait = min(wait, self.deadline - time.monotonic())
            if wait <= 0:
                return None
        return {"index": self.index, "wait_ms": max(1, ms(wait))}, wait

    def answer(self, body: Any) -> Tuple[bool, Optional[Leader]]:
        """``(changed, leader)``: the first answer always counts as a change. Candidates
        joining or leaving move the index without changing the leader: not a change."""
        self.index = int(body["index"])
        leader = leader_of(body)
        if self.last is self._UNSEEN or leader != self.last:
            self.last = leader
            return True, leader
        return False, leader


class Claims:
    """The ``(kind, name)`` of every hold a session's guard has or an acquire is waiting for:
    one guard per hold. The server answers a repeated acquire with the grant the session has
    (that makes retries safe), so a second guard would share the first one's hold and its exit
    would release it under the first. A name stays claimed from the start of the acquire until
    the guard made of the grant is released (and the release answered), or the wait left
    nothing on the server."""

    def __init__(self, session_id: str) -> None:
        self._session_id = session_id
        self._lock = threading.Lock()
        self._held: Set[Tuple[str, str]] = set()

    def claim(self, kind: str, name: str) -> None:
        """Claims ``name`` of ``kind`` (``"semaphores"`` or ``"elections"``), or raises
        :class:`AlreadyHeld`."""
        with self._lock:
            if (kind, name) in self._held:
                raise AlreadyHeld(
                    "already_held",
                    0,
                    f"session {self._session_id} already holds or is acquiring {kind[:-1]} {name}; "
                    "use the guard you have, or another session",
                )
            self._held.add((kind, name))

    def unclaim(self, kind: str, name: str) -> None:
        """Gives the claim back."""
        with self._lock:
            self._held.discard((kind, name))


# Most items in one push (``POST /v1/queues/{name}/items``), appended by one log entry.
PUSH_ITEMS_MAX = 1000
# Page size of the queue and item lists the client reads through (the server's largest).
LIST_PAGE_MAX = 1000
# Largest ``request_id`` of a claim (``permit_wire::CLAIM_REQUEST_ID_MAX``): 2^53 - 1.
CLAIM_REQUEST_ID_MAX = (1 << 53) - 1
# Longest ``error`` a nack keeps (bytes of UTF-8).
NACK_ERROR_MAX = 1024


def claim_request_id() -> int:
    """A random claim ``request_id`` (1 .. 2^53 - 1): names one claim call, so that its retries
    answer the items that claim took instead of taking more."""
    return random.SystemRandom().randint(1, CLAIM_REQUEST_ID_MAX)


def exception_text(kind: Type[BaseException], value: Optional[BaseException]) -> str:
    """``"ValueError: bad input"`` for a nack's ``error``, cut to what the server keeps (at a
    character boundary)."""
    text = "".join(traceback.format_exception_only(kind, value)).strip()
    encoded = text.encode()
    if len(encoded) <= NACK_ERROR_MAX:
        return text
    return encoded[: NACK_ERROR_MAX - 3].decode(errors="ignore") + "..."


@dataclass(frozen=True)
class NewItem:
    """One item of :meth:`Client.push_many` with its own ``delay`` (seconds before it can be
    claimed) or dedupe ``key``; a bare payload there is ``NewItem(payload)``.

    Example::

        client.push_many("jobs", [{"n": 1}, permit.NewItem({"n": 2}, delay=60.0, key="n2")])
    """

    payload: Any
    delay: float = 0.0
    key: Optional[str] = None


def push_item_body(item: NewItem) -> Dict[str, Any]:
    body: Dict[str, Any] = {"payload": item.payload}
    if item.delay:
        body["delay_ms"] = ms(item.delay)
    if item.key is not None:
        body["key"] = item.key
    return body


@dataclass(frozen=True)
class Pushed:
    """A pushed item: its ``id``, its place ``seq`` in the queue, and ``duplicate`` (true when
    the push added nothing: an item with the same ``key`` is pending, delayed or claimed, and
    this is that item).

    Example::

        pushed = client.push("jobs", {"n": 1}, key="n1")
        assert client.push("jobs", {"n": 1}, key="n1") == permit.Pushed(pushed.id, pushed.seq, True)
    """

    id: str
    seq: int
    duplicate: bool = False


def pushed_items(body: Any) -> List[Pushed]:
    return [Pushed(item["id"], item["seq"], bool(item.get("duplicate", False))) for item in body["items"]]


@dataclass(frozen=True)
class QueueInfo:
    """A queue as the server sees it now (a linearizable read): items by state, blocked
    ``claimers``, settings, ``oldest_pending`` (seconds the oldest pending item has waited;
    ``None`` when none is pending) and the log ``index`` of its last change.

    Example::

        info = client.queue("jobs")
        print(info.pending, info.claimed, info.delayed, info.dead_letter)
    """

    name: str
    pending: int
    claimed: int
    delayed: int
    max_attempts: int
    dead_letter: Optional[str]
    max_items: int
    claimers: int
    oldest_pending: Optional[float]
    index: int


def queue_info(body: Any) -> QueueInfo:
    oldest = body.get("oldest_pending_ms")
    return QueueInfo(
        name=body["name"],
        pending=body["pending"],
        claimed=body["claimed"],
        delayed=body["delayed"],
        max_attempts=body["max_attempts"],
        dead_letter=body.get("dead_letter"),
        max_items=body["max_items"],
        claimers=body.get("claimers", 0),
        oldest_pending=None if oldest is None else oldest / 1000.0,
        index=body["index"],
    )


@dataclass(frozen=True)
class ItemInfo:
    """An item of a queue as :meth:`Client.items` lists it: ``state`` (``"pending"``,
    ``"delayed"`` or ``"claimed"``), ``attempt`` (claims so far), the claiming ``session`` and
    claim ``token`` when claimed, ``age`` (seconds in this queue), ``due_at_ms`` (leader time a
    delayed item becomes due), its dedupe ``key``, ``last_error`` (why its last claim ended
    without an ack: a nack's error, or "the claiming session ended") and the ``payload``.

    Example::

        for item in client.items("jobs.dead"):
            print(item.id, item.attempt, item.last_error, item.payload)
    """

    id: str
    seq: int
    state: str
    attempt: int
    session: Optional[str]
    token: Optional[int]
    age: float
    due_at_ms: Optional[int]
    key: Optional[str]
    last_error: Optional[str]
    payload: Any


def item_info(body: Any) -> ItemInfo:
    return ItemInfo(
        id=body["id"],
        seq=body["seq"],
        state=body["state"],
        attempt=body["attempt"],
        session=body.get("session"),
        token=body.get("token"),
        age=body["age_ms"] / 1000.0,
        due_at_ms=body.get("due_at_ms"),
        key=body.get("key"),
        last_error=body.get("last_error"),
        payload=body.get("payload"),
    )
