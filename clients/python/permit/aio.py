"""The asyncio client: the same API as :mod:`permit` with ``async with`` and ``await``;
each session's keepalive is an asyncio task.

This module is the one implementation of both clients: ``gen_sync.py`` makes the blocking
client (``permit/_sync.py``) from it, and a test fails while that file is out of date.

Example::

    import permit.aio

    async def main() -> None:
        async with permit.aio.Client("http://127.0.0.1:7376") as client:
            async with client.session(ttl=10.0) as session:
                async with session.acquire("gpu", capacity=8) as p:
                    print(p.token)
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from types import TracebackType
from typing import Any, AsyncIterator, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Type, Union

import httpx

from ._async_io import Pending
from ._async_io import is_cancellation, join, spawn, track, unless_set, untrack, wait_event, wait_riders
from ._common import (
    KEEP,
    Claims,
    DelayedPermits,
    Event,
    GroupInfo,
    Holder,
    Rate,
    RateInfo,
    Waiter,
    _Keep,
    IDEMPOTENT,
    KEEPALIVE_BATCH_MAX,
    LIST_PAGE_MAX,
    LONG_POLL_MARGIN,
    PUSH_ITEMS_MAX,
    ONE_PASS,
    REQUEST_TIMEOUT,
    STREAM_READ_TIMEOUT,
    UNSENT,
    Attempts,
    EndpointsArg,
    LeaderTracker,
    SseParser,
    events_params,
    Failure,
    ItemInfo,
    KeepaliveAsk,
    KeepaliveBatcher,
    Leader,
    NewItem,
    Outcome,
    Pushed,
    QueueInfo,
    Renewal,
    SemaphoreInfo,
    acquire_body,
    answer_failure,
    check_pid,
    claim_request_id,
    exception_text,
    item_info,
    push_item_body,
    pushed_items,
    queue_info,
    decode,
    httpx_options,
    keepalive_results,
    keepalive_timeout,
    leader_hint,
    leader_of,
    ms,
    settings,
    retry_pause,
    segment,
    semaphore_info,
    put_semaphore_body,
    take_slice,
    TAKE_PAUSE,
    transport_failure,
    OUTAGE_PAUSE_MAX,
    OUTAGE_PAUSE_MIN,
    wait_slice,
)
from ._errors import (
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

log = logging.getLogger("permit.aio")

#: Called with the :class:`SessionLost` error when a session or hold is lost.
OnLost = Callable[[SessionLost], None]


class Client:
    """A connection to a Permit server or cluster. Use it from one event loop; share one per loop.

    ``endpoints`` is one URL or a list (or a comma-separated string) of a cluster's nodes:
    requests go to the node that answered last (or that a successful answer named as the
    leader in ``permit-leader``, when it is one of them: a follower would forward them there)
    and move to the next one on connection errors and ``no_leader`` / ``leader_unreachable``.
    ``auth_token`` is sent as
    ``Authorization: Bearer``; ``ca_file`` trusts a private CA for ``https://`` endpoints;
    ``cert_file``/``key_file`` present a client certificate; ``verify`` is passed to httpx
    (``False``, a CA bundle path or an ``ssl.SSLContext``); ``timeout`` bounds each request
    that does not wait in a queue.

    What is not given comes from the environment variables the ``permit`` CLI reads:
    ``PERMIT_SERVER`` (comma-separated URLs; else ``http://127.0.0.1:7376``),
    ``PERMIT_AUTH_TOKEN``, ``PERMIT_CA_FILE`` and ``PERMIT_CLIENT_CERT``/``PERMIT_CLIENT_KEY``
    (a pair). Explicit arguments always win; an empty variable counts as unset.

    Example::

        client = permit.Client(["http://10.0.0.1:7376", "http://10.0.0.2:7376"],
                               auth_token=os.environ.get("PERMIT_AUTH_TOKEN"))
        async with client.session(ttl=10.0) as session:
            ...
        await client.close()
    """

    def __init__(
        self,
        endpoints: Optional[EndpointsArg] = None,
        *,
        auth_token: Optional[str] = None,
        ca_file: Optional[str] = None,
        cert_file: Optional[str] = None,
        key_file: Optional[str] = None,
        verify: Any = None,
        timeout: float = REQUEST_TIMEOUT,
        headers: Optional[Dict[str, str]] = None,
    ) -> None:
        given = settings(endpoints, auth_token, ca_file, cert_file, key_file)
        self.endpoints: List[str] = given.endpoints
        self.timeout = timeout
        self._options = httpx_options(
            given.auth_token, given.ca_file, given.cert_file, given.key_file, verify, headers
        )
        self._preferred = 0
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._http: Optional[httpx.AsyncClient] = None
        # Carries the background keepalives of all this client's sessions in shared requests.
        self._batcher = _Batcher(self)

    def _new_pool(self) -> httpx.AsyncClient:
        options = dict(self._options)
        transport = httpx.AsyncHTTPTransport(**options.pop("transport"))
        return httpx.AsyncClient(transport=transport, **options)

    def _pool(self) -> httpx.AsyncClient:
        # A forked child must not share the parent's sockets: it gets a pool of its own.
        with self._lock:
            if self._http is None or self._pid != os.getpid():
                self._pid = os.getpid()
                self._http = self._new_pool()
            return self._http

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Optional[Dict[str, Any]] = None,
        params: Optional[Dict[str, Any]] = None,
        policy: str = IDEMPOTENT,
        timeout: Optional[float] = None,
        http: Optional[httpx.AsyncClient] = None,
    ) -> Tuple[int, Any]:
        http = http or self._pool()
        attempts = Attempts(policy, len(self.endpoints))
        limit = httpx.Timeout(timeout if timeout is not None else self.timeout, connect=2.0)
        while True:
            index = self._preferred % len(self.endpoints)
            endpoint = self.endpoints[index]
            try:
                try:
                    response = await http.request(method, endpoint + path, json=json, params=params, timeout=limit)
                except httpx.TransportError as error:
                    raise transport_failure(endpoint, error) from None
                if response.status_code >= 300:
                    raise answer_failure(endpoint, response)
                self._preferred = leader_hint(self.endpoints, self._preferred, response)
                return response.status_code, decode(endpoint, response)
            except Failure as failure:
                pause = attempts.after(failure, index)
                if pause is None:
                    raise failure.error from None
                log.debug("retrying on the next endpoint after %s", failure.error)
                if self._preferred % len(self.endpoints) == index:
                    self._preferred = index + 1
                if pause:
                    await asyncio.sleep(pause)

    def session(
        self, ttl: float = 10.0, name: Optional[str] = None, on_lost: Optional[OnLost] = None
    ) -> "Pending[Session]":
        """Creates a session that lives ``ttl`` seconds after its last keepalive; a task
        sends one every ``ttl/3``. ``on_lost`` is called (from the keepalive task) with a
        :class:`permit.SessionLost` the moment the session is known or presumed lost. The
        keepalives of all sessions of this client go together in batched requests
        (``POST /v1/sessions/keepalive``; one per session to a server without that route).

        Creation is not retried blindly: only a request that certainly did not reach a
        leader (connection refused, ``leader_unreachable``) is sent again, so a timeout can
        leave an unused session on the server that expires after ``ttl``.

        Example::

            async with client.session(ttl=10.0, name="worker-1") as session:
                print(session.id)
        """
        return Pending(self._session(ttl, name, on_lost))

    async def _session(self, ttl: float, name: Optional[str], on_lost: Optional[OnLost]) -> "Session":
        body: Dict[str, Any] = {"ttl_ms": ms(ttl)}
        if name is not None:
            body["name"] = name
        sent = time.monotonic()
        _, answer = await self._request("POST", "/v1/sessions", json=body, policy=UNSENT)
        return Session(self, answer["id"], answer["ttl_ms"] / 1000.0, name, on_lost, sent)

    async def set_capacity(
        self,
        name: str,
        capacity: int,
        *,
        rate: Union[Rate, None, _Keep] = KEEP,
        lock_delay: Union[float, None, _Keep] = KEEP,
        group_max: Union[int, None, _Keep] = KEEP,
    ) -> SemaphoreInfo:
        """Creates semaphore ``name`` with ``capacity`` permits, or changes its capacity, and
        sets its policies. Each policy left at ``permit.KEEP`` (the default) stays as it is
        (a new semaphore has none); ``None`` removes it:

        - ``rate``: a :class:`permit.Rate`; permits granted by acquires and takes obey it as
          well as the capacity.
        - ``lock_delay``: seconds (0 to 60; ``None`` or 0: none) that the permits of a hold
          ended by its session's expiry or a revoke stay out of circulation; a release returns
          them at once.
        - ``group_max``: most permits the holders of one ``group`` (see :meth:`Session.acquire`)
          may hold at once.

        A cluster with a member too old for the policies answers :class:`permit.Conflict`
        ``feature_unavailable``.

        Example::

            info = await client.set_capacity("gpu", 8)   # info.capacity == 8
            await client.set_capacity("api", 4, rate=permit.Rate(10, per=1.0), lock_delay=5.0)
            await client.set_capacity("api", 4, rate=None)   # no rate; the lock-delay stays
        """
        body = put_semaphore_body(capacity, rate, lock_delay, group_max)
        _, answer = await self._request("PUT", f"/v1/semaphores/{segment(name)}", json=body)
        return semaphore_info(answer)

    async def take(self, name: str, permits: int = 1, *, timeout: Optional[float] = 0.0) -> int:
        """Takes ``permits`` of semaphore ``name``'s rate, holding nothing and needing no
        session (a rate limiter): answers the take's token (from the counter of grants, larger
        than every token before it). A semaphore without a rate takes at once, always. When the
        rate has no room (or others wait first), ``timeout=0`` (the default) raises
        :class:`permit.RateLimited` at once, with ``retry_after`` (seconds) saying when the
        rate allows it; a ``timeout`` (seconds; ``None`` waits as long as it takes) waits in
        the semaphore's FIFO queue, behind earlier acquires and takes, and raises
        ``RateLimited`` if it passes first. The server waits at most 60 s per request: a
        longer wait asks again, joining the queue at its end.

        A take is re-sent only when it certainly did not arrive (it consumes the rate), so a
        connection lost in the middle raises :class:`permit.ClusterUnavailable`, taken or not.
        A waiting take whose caller stops waiting (cancelled or interrupted) closes its
        request, and the server ends the take: it leaves the queue and spends nothing.

        Example::

            token = await client.take("api.quota", timeout=30.0)
            await call_the_api()
        """
        path = f"/v1/semaphores/{segment(name)}/take"
        try_once = timeout is not None and timeout <= 0
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = take_slice(deadline, try_once)
            body = {"permits": permits, "wait_ms": ms(wait)}
            sent = time.monotonic()
            try:
                _, answer = await self._request(
                    "POST", path, json=body, policy=UNSENT, timeout=max(self.timeout, wait + LONG_POLL_MARGIN)
                )
            except RateLimited as error:
                now = time.monotonic()
                if try_once or (deadline is not None and now >= deadline):
                    raise
                if now - sent < wait:
                    # Refused before its wait was up (the server saw the rate cannot allow it in
                    # time): ask again when it says the rate allows it, if that is in time. So
                    # this loop never spins.
                    pause = error.retry_after if error.retry_after is not None else TAKE_PAUSE
                    if deadline is not None and now + pause >= deadline:
                        raise
                    await asyncio.sleep(pause)
                continue
            return int(answer["token"])

    async def semaphore(self, name: str) -> SemaphoreInfo:
        """Capacity, availability, holders and waiters of a semaphore (linearizable).

        Example::

            info = await client.semaphore("gpu")
            print(info.available, [(h.session, h.permits, h.token) for h in info.holders])
        """
        _, body = await self._request("GET", f"/v1/semaphores/{segment(name)}")
        return semaphore_info(body)

    async def delete_semaphore(self, name: str) -> None:
        """Deletes an idle semaphore (``permit.Conflict`` ``semaphore_busy`` if it is used).

        Example::

            await client.delete_semaphore("gpu")
        """
        await self._request("DELETE", f"/v1/semaphores/{segment(name)}")

    async def leader(self, election: str) -> Optional[Leader]:
        """The current leader ``(session, value, token)`` of an election, or ``None``.

        Example::

            leader = await client.leader("scheduler")
            print(leader.value if leader else "nobody leads")
        """
        _, body = await self._request("GET", f"/v1/elections/{segment(election)}")
        return leader_of(body)

    def observe_leader(self, election: str, *, timeout: Optional[float] = None) -> "LeaderWatch":
        """Follows the leader of ``election``: an async iterator that yields the current
        leader (``None`` when nobody leads) at once, then the new one each time it changes,
        until ``timeout`` seconds (``None``: no end) pass or it is closed (it is also an
        async context manager). Pushed by the server: blocking reads
        (``GET /v1/elections/{name}?index=N``), no polling.

        Example::

            async with client.observe_leader("scheduler", timeout=3600.0) as leaders:
                async for leader in leaders:
                    print("leader:", leader.value if leader else None)
        """
        return LeaderWatch(self, election, timeout)

    def events(
        self,
        prefix: Optional[str] = None,
        *,
        kinds: Optional[Sequence[str]] = None,
        after: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> "EventStream":
        """The event stream of the node this client reaches (``GET /v1/events``, Server-Sent
        Events): an async iterator of :class:`permit.Event` and an async context manager that
        closes the connection. ``prefix`` keeps object events whose name starts with it (session
        events pass only without a prefix), ``kinds`` only those kinds, ``after`` resumes after
        that event seq (``Last-Event-ID``; else new events only); with ``timeout`` the server
        ends the stream after that many seconds and the iteration stops. A dropped connection
        raises :class:`permit.ClusterUnavailable`; ``stream.last_id`` is the seq to resume
        ``after``.

        Example::

            async with client.events(prefix="gpu", kinds=["granted", "released"], timeout=60.0) as stream:
                async for event in stream:
                    print(event.id, event.kind, event.data["name"])
        """
        return EventStream(self, events_params(prefix, kinds, timeout), after)

    async def keepalive_many(self, ids: Sequence[str]) -> Dict[str, Union[float, PermitError]]:
        """Keeps sessions kept alive by hand (not ``Session`` objects, which keep themselves
        alive) alive with one request per 1024 ids (``POST /v1/sessions/keepalive``). Maps each
        id to its TTL in seconds (renewed: it lives at least that long after the request was
        sent) or to the error the single keepalive would raise (``permit.SessionLost``
        ``session_not_found``, ``permit.AuthError`` ``permission_denied``). A malformed or
        repeated id raises ``permit.InvalidRequest`` and renews nothing of its request.

        Example::

            results = await client.keepalive_many(ids)
            gone = [id for id, result in results.items() if isinstance(result, permit.PermitError)]
        """
        results: Dict[str, Union[float, PermitError]] = {}
        for start in range(0, len(ids), KEEPALIVE_BATCH_MAX):
            chunk = list(ids[start : start + KEEPALIVE_BATCH_MAX])
            _, body = await self._request("POST", "/v1/sessions/keepalive", json={"sessions": chunk})
            results.update(keepalive_results(chunk, body))
        return results

    async def validate(self, name: str, token: int) -> bool:
        """Whether a current holder of semaphore ``name`` carries fencing ``token``
        (linearizable).

        Example::

            if not await client.validate("gpu", token):
                raise RuntimeError("stale writer")
        """
        _, body = await self._request("POST", f"/v1/semaphores/{segment(name)}/validate", json={"token": token})
        return bool(body["valid"])

    async def push(self, queue: str, payload: Any, *, delay: float = 0.0, key: Optional[str] = None) -> Pushed:
        """Appends one item to ``queue`` (created with the defaults if missing): ``payload`` is
        any JSON value (at most 64 KiB encoded, else :class:`permit.InvalidRequest`
        ``payload_too_large``), ``delay`` keeps it from claims for that many seconds, ``key``
        dedupes: while an item pushed with that key is pending, delayed or claimed, the push adds
        nothing and answers that item (``duplicate``). A full queue raises
        :class:`permit.Conflict` ``queue_full``.

        A push with a ``key`` is retried like a read (a repeat adds nothing); one without is
        re-sent only when it certainly did not arrive, so after a timeout it raises
        :class:`permit.ClusterUnavailable` and may or may not have been applied: give a key to
        make your own retry safe.

        Example::

            pushed = await client.push("jobs", {"video": 42}, key="video-42")
            print(pushed.id, pushed.seq)
        """
        (pushed,) = await self.push_many(queue, [NewItem(payload, delay, key)])
        return pushed

    async def push_many(self, queue: str, items: Iterable[Any]) -> List[Pushed]:
        """Appends up to 1000 items to ``queue`` in order, all or nothing (one log entry), and
        returns one :class:`permit.Pushed` per item. Each item is a payload, or a
        :class:`permit.NewItem` with its own ``delay`` and ``key``. Retried as :meth:`push`:
        like a read only when every item has a ``key``.

        Example::

            pushed = await client.push_many("jobs", [{"n": 1}, {"n": 2}, permit.NewItem({"n": 3}, delay=5.0)])
            assert [p.seq for p in pushed] == sorted(p.seq for p in pushed)
        """
        entries = [item if isinstance(item, NewItem) else NewItem(item) for item in items]
        if not entries:
            return []
        if len(entries) > PUSH_ITEMS_MAX:
            raise ValueError(f"one push carries at most {PUSH_ITEMS_MAX} items, not {len(entries)}")
        body = {"items": [push_item_body(entry) for entry in entries]}
        policy = IDEMPOTENT if all(entry.key is not None for entry in entries) else UNSENT
        _, answer = await self._request("POST", f"/v1/queues/{segment(queue)}/items", json=body, policy=policy)
        return pushed_items(answer)

    async def put_queue(
        self,
        name: str,
        *,
        max_attempts: Optional[int] = None,
        dead_letter: Optional[str] = None,
        max_items: Optional[int] = None,
    ) -> QueueInfo:
        """Creates queue ``name`` or changes the settings given (a new queue takes the defaults
        for the others): ``max_attempts`` claims of one item before it moves to the
        ``dead_letter`` queue (1..1000, default 5; default dead-letter queue ``{name}.dead``),
        ``max_items`` it holds (default 1,000,000). Needs the admin right on the queue.

        Example::

            info = await client.put_queue("jobs", max_attempts=3)
            assert info.dead_letter == "jobs.dead"
        """
        body: Dict[str, Any] = {}
        if max_attempts is not None:
            body["max_attempts"] = max_attempts
        if dead_letter is not None:
            body["dead_letter"] = dead_letter
        if max_items is not None:
            body["max_items"] = max_items
        _, answer = await self._request("PUT", f"/v1/queues/{segment(name)}", json=body)
        return queue_info(answer)

    async def queue(self, name: str) -> QueueInfo:
        """A queue's items by state, blocked claimers and settings (linearizable);
        :class:`permit.NotFound` ``queue_not_found`` if there is none.

        Example::

            info = await client.queue("jobs")
            print(info.pending, info.claimed, info.oldest_pending)
        """
        _, body = await self._request("GET", f"/v1/queues/{segment(name)}")
        return queue_info(body)

    async def queues(self) -> List[QueueInfo]:
        """Every queue this client may read, in name order (read page by page).

        Example::

            print([q.name for q in await client.queues()])
        """
        out: List[QueueInfo] = []
        params: Dict[str, Any] = {"limit": LIST_PAGE_MAX}
        while True:
            _, body = await self._request("GET", "/v1/queues", params=params)
            out += [queue_info(queue) for queue in body["queues"]]
            if not body.get("next_after"):
                return out
            params["after"] = body["next_after"]

    async def delete_queue(self, name: str) -> None:
        """Deletes a queue that holds no item and no blocked claim (:class:`permit.Conflict`
        ``queue_busy`` otherwise).

        Example::

            await client.delete_queue("jobs")
        """
        await self._request("DELETE", f"/v1/queues/{segment(name)}")

    async def items(self, queue: str, state: Optional[str] = None, *, limit: Optional[int] = None) -> List[ItemInfo]:
        """The items of ``queue`` in the order they entered it (id order), with their state,
        attempts, claiming session and age: only those in ``state`` (``"pending"``,
        ``"delayed"`` or ``"claimed"``) if given, at most ``limit`` (``None``: all, read page
        by page). Dead-lettered items are in the dead-letter queue.

        Example::

            for item in await client.items("jobs.dead"):
                print(item.payload, item.attempt, item.last_error)
        """
        out: List[ItemInfo] = []
        params: Dict[str, Any] = {}
        if state is not None:
            params["state"] = state
        while limit is None or len(out) < limit:
            params["limit"] = LIST_PAGE_MAX if limit is None else min(LIST_PAGE_MAX, limit - len(out))
            _, body = await self._request("GET", f"/v1/queues/{segment(queue)}/items", params=params)
            out += [item_info(item) for item in body["items"]]
            if not body.get("next_after"):
                break
            params["after"] = body["next_after"]
        return out

    async def remove_item(self, queue: str, id: str) -> None:
        """Removes item ``id`` from ``queue`` whatever its state (admin); a claim of it ends,
        and its ack or nack gets ``claim_lost``. :class:`permit.NotFound` ``item_not_found``
        if it is not there.

        Example::

            await client.remove_item("jobs", pushed.id)
        """
        await self._request("DELETE", f"/v1/queues/{segment(queue)}/items/{segment(id)}")

    async def close(self) -> None:
        """Closes the connection pool (sessions are closed by their own ``close``).

        Example::

            await client.close()
        """
        with self._lock:
            http, self._http = self._http, None
        if http is not None and self._pid == os.getpid():
            await http.aclose()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(
        self, kind: Optional[Type[BaseException]], value: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        await self.close()


class Session:
    """A session: holds permits, leaderships and claimed queue items, kept alive by a
    background asyncio task.

    ``lost`` (an ``asyncio.Event``) is set the moment the session is known or presumed lost:
    the server no longer knows it, or no keepalive was acknowledged before the conservative
    local deadline (the send time of the last acknowledged keepalive plus the TTL). Then every
    permit, leadership and claimed item it held is lost too. A session belongs to the process that created
    it: a forked child gets :class:`permit.SessionForked` when it uses it.

    Example::

        async with client.session(ttl=10.0) as session:
            async with session.acquire("gpu") as p:
                do_work(p.token)
    """

    def __init__(
        self, client: Client, id: str, ttl: float, name: Optional[str], on_lost: Optional[OnLost], sent: float
    ) -> None:
        self.client = client
        self.id = id
        self.ttl = ttl
        self.name = name
        self.lost = asyncio.Event()
        self._on_lost = on_lost
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._acknowledged_sent = sent
        self._deadline = sent + ttl
        self._jeopardy = False
        self._closed = False
        self._holds: Set[_Lease] = set()
        self._claims = Claims(id)
        # A pool of its own: the session's long-polls and keepalives never queue behind (or
        # make the client's pool scan) other sessions' connections.
        self._http = client._new_pool()
        self._stop = asyncio.Event()
        # Set to wake the keepalive task: stopped, or a batch departs (``_departed``).
        self._wake = asyncio.Event()
        self._departed = False
        self._worker = spawn(self._keepalive, f"permit-keepalive-{id[:8]}")
        track(self)

    @property
    def state(self) -> str:
        """``"alive"``, ``"jeopardy"`` (a keepalive failed; retrying until the deadline),
        ``"lost"`` or ``"closed"``.

        Example::

            if session.state == "jeopardy":
                log.warning("permit server unreachable")
        """
        if self._closed:
            return "closed"
        if self.lost.is_set():
            return "lost"
        return "jeopardy" if self._jeopardy else "alive"

    @property
    def deadline(self) -> float:
        """``time.monotonic()`` instant after which the session is presumed lost unless a
        keepalive is acknowledged first.

        Example::

            print("safe for", session.deadline - time.monotonic(), "s")
        """
        return self._deadline

    async def _request(self, method: str, path: str, **options: Any) -> Tuple[int, Any]:
        return await self.client._request(method, path, http=self._http, **options)

    def _check(self) -> None:
        check_pid(self._pid, self.id)
        if self._closed:
            raise SessionLost("session_closed", 0, f"session {self.id} was closed")
        if self.lost.is_set():
            raise SessionLost("session_lost", 0, f"session {self.id} is lost")

    def acquire(
        self,
        name: str,
        permits: int = 1,
        *,
        capacity: Optional[int] = None,
        timeout: Optional[float] = None,
        max_hold: Optional[float] = None,
        ephemeral: bool = True,
        group: Optional[str] = None,
        on_lost: Optional[OnLost] = None,
    ) -> "Pending[Permit]":
        """Waits its turn (strict FIFO) for ``permits`` of semaphore ``name`` and returns the
        :class:`Permit`, a context manager that releases on exit. The wait is pushed by the
        server (one long-poll, no polling). ``capacity`` creates the semaphore if missing,
        **ephemeral** by default: the server deletes it when its last holder and waiter leave,
        as the CLI does (``ephemeral=False`` keeps it, like the CLI's ``--keep``; a
        ``set_capacity`` also makes it permanent); ``timeout`` (seconds, ``None`` = forever, ``0`` = try once) raises
        :class:`permit.Timeout` and gives the queue place up (:class:`permit.Unavailable` when
        0); ``max_hold`` makes the server release the hold after that long; ``group`` (1 to
        64 of ``A-Z a-z 0-9 . _ : -``) counts the hold against the semaphore's ``group_max``:
        an acquire whose group is at its cap is passed over, keeping its place, and others
        behind it are served. A semaphore's rate and lock-delay hold back grants too.

        Example::

            async with session.acquire("gpu", permits=2, capacity=8, timeout=30.0) as p:
                do_work(p.token)
            async with session.acquire("gpu", group="team-a") as p:
                do_work(p.token)
        """
        return Pending(self._acquire(name, permits, capacity, timeout, max_hold, ephemeral, group, on_lost))

    async def _acquire(
        self,
        name: str,
        permits: int,
        capacity: Optional[int],
        timeout: Optional[float],
        max_hold: Optional[float],
        ephemeral: bool,
        group: Optional[str],
        on_lost: Optional[OnLost],
    ) -> "Permit":
        body: Callable[[float], Dict[str, Any]] = lambda wait: acquire_body(self.id, permits, wait, capacity, max_hold, ephemeral, group)  # noqa: E731
        answer, not_before = await self._wait_claimed("semaphores", name, body, timeout)
        hold = Permit(self, name, answer["permits"], answer["token"], on_lost)
        if max_hold is not None:
            hold._expires = not_before + max_hold
        self._adopt(hold)
        return hold

    async def try_acquire(
        self,
        name: str,
        permits: int = 1,
        *,
        capacity: Optional[int] = None,
        max_hold: Optional[float] = None,
        ephemeral: bool = True,
        group: Optional[str] = None,
        on_lost: Optional[OnLost] = None,
    ) -> Optional["Permit"]:
        """The :class:`Permit` if ``permits`` are free and nobody queues first, else ``None``;
        never queues. The options are those of :meth:`acquire`; a rate with no room, or
        permits in lock-delay, also answer ``None``.

        Example::

            p = await session.try_acquire("gpu")
            if p is not None:
                async with p:
                    do_work(p.token)
        """
        try:
            return await self._acquire(name, permits, capacity, 0, max_hold, ephemeral, group, on_lost)
        except Unavailable:
            return None

    def campaign(
        self, election: str, value: str = "", *, timeout: Optional[float] = None, on_lost: Optional[OnLost] = None
    ) -> "Pending[Leadership]":
        """Waits until this session leads ``election``, publishing ``value``, and returns the
        :class:`Leadership` (a context manager that resigns on exit). ``timeout`` as for
        :meth:`acquire`.

        Example::

            async with session.campaign("scheduler", value="host-a") as leadership:
                run_scheduler(leadership.token)
        """
        return Pending(self._campaign(election, value, timeout, on_lost))

    async def _campaign(
        self, election: str, value: str, timeout: Optional[float], on_lost: Optional[OnLost]
    ) -> "Leadership":
        answer, _ = await self._wait_claimed(
            "elections", election, lambda wait: {"session": self.id, "value": value, "wait_ms": ms(wait)}, timeout
        )
        hold = Leadership(self, election, value, answer["token"], on_lost)
        self._adopt(hold)
        return hold

    def claim(self, queue: str, *, timeout: Optional[float] = None, on_lost: Optional[OnLost] = None) -> "Pending[Item]":
        """Claims the next due item of ``queue`` (strict FIFO by ``seq``, blocked claimers
        served in the order they came) and returns the :class:`Item`: a lease of this session
        with its own fencing ``token``, a context manager that acks on a clean exit and nacks
        (with the exception's text as ``error``) when the block raises. The wait is pushed by
        the server (one long-poll, no polling). ``timeout`` (seconds; ``None`` waits forever)
        raises :class:`permit.Timeout` when no item came in time, and ``0`` tries once and
        raises :class:`permit.Unavailable` when none is due, as for :meth:`acquire`
        (:meth:`try_claim` answers ``None`` instead). A missing queue raises
        :class:`permit.NotFound` ``queue_not_found``.

        The claim carries a random ``request_id``: a retry after a connection error, a
        timeout or a 503 (on the next endpoint) answers the item this claim took rather than
        taking another, and an outage shorter than the session is ridden out as for
        :meth:`acquire`. The item is lost (``item.lost``, ``on_lost``, ``item.token`` raises
        :class:`permit.SessionLost`) when the session is: the server then makes it pending
        again, for another worker.

        Example::

            async with session.claim("jobs", timeout=30.0) as item:
                await process(item.payload, fence=item.token)
            # acked here; an exception in the block would have nacked it
        """
        return Pending(self._claim_one(queue, timeout, on_lost))

    async def _claim_one(self, queue: str, timeout: Optional[float], on_lost: Optional[OnLost]) -> "Item":
        items = await self._claim(queue, 1, timeout, on_lost)
        if items:
            return items[0]
        if timeout is not None and timeout <= 0:
            raise Unavailable("unavailable", 0, f"queue {queue}: no item is due now")
        raise Timeout("wait_timeout", 0, f"queue {queue}: no item came within {timeout} s")

    async def try_claim(self, queue: str, *, on_lost: Optional[OnLost] = None) -> Optional[Item]:
        """The next due :class:`Item` of ``queue``, or ``None`` when none is due now; never
        waits.

        Example::

            item = await session.try_claim("jobs")
            if item is not None:
                async with item:
                    await process(item.payload)
        """
        items = await self._claim(queue, 1, 0, on_lost)
        return items[0] if items else None

    async def claim_many(
        self, queue: str, max: int, *, timeout: Optional[float] = None, on_lost: Optional[OnLost] = None
    ) -> List[Item]:
        """Claims up to ``max`` (1..1000) due items of ``queue`` at once, in ``seq`` order:
        waits (``timeout`` seconds, ``None`` forever, ``0`` not at all) until at least one is
        due and answers what is due then; an empty list when none came in time. Ack or nack
        each (or use each as a context manager). Retried as :meth:`claim`.

        Example::

            for item in await session.claim_many("jobs", 10, timeout=5.0):
                async with item:
                    await process(item.payload)
        """
        return await self._claim(queue, max, timeout, on_lost)

    async def _claim(self, queue: str, most: int, timeout: Optional[float], on_lost: Optional[OnLost]) -> List["Item"]:
        self._check()
        path = f"/v1/queues/{segment(queue)}/claim"
        # One id for the whole call: every retry and every later slice of the wait names this
        # claim, so items it took whose answer was lost are answered by the next ask.
        request_id = claim_request_id()
        try_once = timeout is not None and timeout <= 0
        deadline = None if timeout is None else time.monotonic() + timeout
        # The claim may be waiting or hold items on the server that this call has not answered.
        armed = False
        outage_pause = OUTAGE_PAUSE_MIN
        try:
            while True:
                # At least 1 ms unless trying once: a repeat of a claim that still waits on the
                # server must itself wait.
                wait = wait_slice(deadline, try_once, self.ttl)
                body = {"session": self.id, "max": most, "wait_ms": ms(wait), "request_id": request_id}
                armed = True
                try:
                    _, answer = await unless_set(
                        self._request("POST", path, json=body, timeout=max(self.client.timeout, wait + LONG_POLL_MARGIN)),
                        self.lost,
                        SessionLost("session_lost", 0, f"session {self.id} is lost"),
                    )
                except SessionLost as error:
                    armed = False
                    self._lose(error)
                    raise
                except ClusterUnavailable:
                    # As a blocked acquire: the claim waits on the server while the session
                    # lives, so ask again (same id) until the deadline or the session's end.
                    if try_once:
                        raise
                    outage_pause = await self._ride_out(outage_pause, deadline)
                    if deadline is not None and time.monotonic() >= deadline:
                        raise Timeout("wait_timeout", 0, f"queue {queue}: no item came within {timeout} s (the cluster was unreachable)")
                    continue
                except PermitError:
                    armed = False
                    raise
                # Answered: the server ended the claim's wait (items, or its wait_ms passed).
                armed = False
                outage_pause = OUTAGE_PAUSE_MIN
                items = [Item(self, queue, raw, on_lost) for raw in answer["items"]]
                for item in items:
                    self._adopt(item)
                if items or try_once or (deadline is not None and time.monotonic() >= deadline):
                    return items
                self._check()
        finally:
            if armed:
                await self._abandon_claim(queue, request_id)

    async def _abandon_claim(self, queue: str, request_id: int) -> None:
        """Ends a claim left unanswered (cancelled, failed): `claim/cancel` ends its wait on the
        server without taking anything and answers what it took, which is nacked back. Best
        effort: whatever stays claimed is pending again when the session ends."""
        try:
            if os.getpid() != self._pid or self.lost.is_set() or self._closed:
                return
            body = {"session": self.id, "request_id": request_id}
            _, answer = await self._request("POST", f"/v1/queues/{segment(queue)}/claim/cancel", json=body)
            for raw in answer["items"]:
                item = Item(self, queue, raw, None)
                self._adopt(item)
                await item.nack(error="the claim was abandoned by its caller")
        except Exception as error:  # the session's end frees what is left
            log.debug("abandoning a claim on %s failed: %s", queue, error)

    async def _wait_claimed(
        self, kind: str, name: str, body: Callable[[float], Dict[str, Any]], timeout: Optional[float]
    ) -> Tuple[Dict[str, Any], float]:
        # One guard per hold (see ``Claims``).
        self._check()
        self._claims.claim(kind, name)
        granted = None
        try:
            granted = await self._wait(kind, name, body, timeout)
        finally:
            if granted is None:
                self._claims.unclaim(kind, name)
        if granted is None:
            what = "not enough free permits now" if kind == "semaphores" else "another session leads"
            raise Unavailable("unavailable", 409, f"{kind[:-1]} {name}: {what}")
        return granted

    async def _wait(
        self, kind: str, name: str, body: Callable[[float], Dict[str, Any]], timeout: Optional[float]
    ) -> Optional[Tuple[Dict[str, Any], float]]:
        self._check()
        action = "acquire" if kind == "semaphores" else "campaign"
        path = f"/v1/{kind}/{segment(name)}/{action}"
        try_once = timeout is not None and timeout <= 0
        deadline = None if timeout is None else time.monotonic() + timeout
        armed = False
        last_waiting_sent: Optional[float] = None
        outage_pause = OUTAGE_PAUSE_MIN
        try:
            while True:
                wait = wait_slice(deadline, try_once, self.ttl)
                sent = time.monotonic()
                armed = True
                try:
                    status, answer = await unless_set(
                        self._request(
                            "POST", path, json=body(wait), timeout=max(self.client.timeout, wait + LONG_POLL_MARGIN)
                        ),
                        self.lost,
                        SessionLost("session_lost", 0, f"session {self.id} is lost"),
                    )
                except Unavailable:
                    armed = False
                    if try_once:
                        return None
                    raise
                except SessionLost as error:
                    armed = False
                    self._lose(error)
                    raise
                except ClusterUnavailable:
                    # An outage (no node reachable, no leader, ...): the server keeps the place
                    # while the session lives, so ask again until the session's local deadline
                    # (the keepalive task then marks it lost) or the timeout. A place that may
                    # be left is given up below.
                    if try_once:
                        raise
                    outage_pause = await self._ride_out(outage_pause, deadline)
                    if deadline is not None and time.monotonic() >= deadline:
                        raise Timeout("wait_timeout", 0, f"{name}: not granted within {timeout} s (the cluster was unreachable); the queue place is given up")
                    continue
                except PermitError:
                    armed = False
                    raise
                outage_pause = OUTAGE_PAUSE_MIN
                if status == 200:
                    armed = False
                    return answer, (last_waiting_sent if last_waiting_sent is not None else sent)
                self._check()
                if try_once or (deadline is not None and time.monotonic() >= deadline):
                    # Cancel the wait; a grant that raced with the timeout is released too.
                    await self._give_up(kind, name)
                    armed = False
                    raise Timeout("wait_timeout", 0, f"{name}: not granted within {timeout} s; the queue place was given up")
                last_waiting_sent = sent
        finally:
            if armed:
                await self._give_up_quietly(kind, name)

    async def _ride_out(self, pause: float, deadline: Optional[float]) -> float:
        """Pauses between asks during an outage (shorter if the wait's ``deadline`` is nearer);
        raises SessionLost when the session is lost meanwhile; returns the next pause."""
        if deadline is not None:
            pause = max(0.0, min(pause, deadline - time.monotonic()))
        await wait_event(self.lost, pause)
        self._check()
        return min(pause * 2, OUTAGE_PAUSE_MAX) if pause > 0 else OUTAGE_PAUSE_MIN

    async def _give_up(self, kind: str, name: str) -> None:
        action = "release" if kind == "semaphores" else "resign"
        try:
            await self._request("POST", f"/v1/{kind}/{segment(name)}/{action}", json={"session": self.id})
        except SessionLost as error:
            self._lose(error)
            raise

    async def _give_up_quietly(self, kind: str, name: str) -> None:
        try:
            if os.getpid() == self._pid and not self.lost.is_set():
                await self._give_up(kind, name)
        except Exception as error:  # the place is given up when the session ends anyway
            log.debug("giving up %s %s failed: %s", kind, name, error)

    def _adopt(self, hold: "_Lease") -> None:
        with self._lock:
            self._holds.add(hold)
        if self.lost.is_set():
            hold._mark_lost(SessionLost("session_lost", 0, f"session {self.id} is lost"))

    def _forget(self, hold: "_Lease") -> None:
        with self._lock:
            self._holds.discard(hold)

    def _lose(self, error: SessionLost) -> None:
        with self._lock:
            if self.lost.is_set() or self._closed:
                return
            self.lost.set()
            holds = list(self._holds)
            self._holds.clear()
        self._halt()
        log.warning("permit session %s lost: %s", self.id, error.message)
        for hold in holds:
            hold._mark_lost(error)
        if self._on_lost is not None:
            _call(self._on_lost, error)

    async def _keepalive(self) -> None:
        endpoints = len(self.client.endpoints)
        batcher = self.client._batcher
        while not self.lost.is_set():
            with self._lock:
                deadline = self._deadline
                expiries = [h._expires for h in self._holds if h._expires is not None]
            now = time.monotonic()
            due = now + retry_pause(self.ttl) if self._jeopardy else self._acknowledged_sent + self.ttl / 3
            wake = min([due, deadline] + expiries)
            # Past half its period, a healthy session rides along with any batch this client
            # sends: the sessions of one client fall into step and share their requests.
            ride_from = self._acknowledged_sent + self.ttl / 6
            if not self._jeopardy:
                if now >= ride_from:
                    batcher.ride(id(self), self._on_departure)
                else:
                    wake = min(wake, ride_from)
            await wait_event(self._wake, wake - now)
            batcher.unride(id(self))
            self._wake.clear()
            departed, self._departed = self._departed, False
            if self._stop.is_set():
                return
            self._expire_holds()
            sent = time.monotonic()
            if sent >= deadline:
                self._lose(SessionLost("session_lost", 0, "no keepalive was acknowledged before the local deadline"))
                await self._close_on_server()
                return
            if sent < due and not departed:
                continue  # woken for a hold's expiry or to ride from now on
            try:
                outcome = await batcher.keepalive(self, keepalive_timeout(deadline - sent, endpoints), deadline - sent)
            except Exception as error:  # keep the keepalive task alive whatever happens
                log.warning("keepalive of %s failed: %r", self.id, error)
                self._jeopardy = True
                continue
            if self._stop.is_set():
                return  # closed while it waited: the answer no longer matters
            if isinstance(outcome, SessionLost):
                self._lose(outcome)
                return
            if isinstance(outcome, PermitError):
                log.debug("keepalive of %s failed: %s", self.id, outcome)
                self._jeopardy = True
                continue
            with self._lock:
                # ``outcome.sent`` is when the request that carried it was sent (at or after
                # this loop asked): the server renewed after that.
                self._acknowledged_sent = outcome.sent
                self._deadline = max(self._deadline, outcome.sent + min(self.ttl, outcome.ttl))
            self._jeopardy = False

    def _on_departure(self) -> None:
        self._departed = True
        self._wake.set()

    def _halt(self) -> None:
        self._stop.set()
        self._wake.set()

    def _expire_holds(self) -> None:
        now = time.monotonic()
        with self._lock:
            expired = [h for h in self._holds if h._expires is not None and h._expires <= now]
            for hold in expired:
                self._holds.discard(hold)
        for hold in expired:
            hold._mark_lost(SessionLost("hold_expired", 0, f"{hold.name}: max_hold passed; the server released it"))

    async def _close_on_server(self) -> None:
        try:
            await self._request("DELETE", f"/v1/sessions/{self.id}", policy=IDEMPOTENT)
        except Exception as error:  # best effort: it expires on its own
            log.debug("closing session %s: %s; it expires on its own", self.id, error)

    async def close(self) -> None:
        """Stops the keepalive and closes the session on the server, releasing everything it
        holds and cancelling its waits. Raises :class:`permit.SessionForked` in a forked child.

        Example::

            session = await client.session()
            try:
                ...
            finally:
                await session.close()
        """
        check_pid(self._pid, self.id)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            holds = list(self._holds)
            self._holds.clear()
        untrack(self)
        self._halt()
        await join(self._worker, REQUEST_TIMEOUT)
        for hold in holds:
            hold._released = True
        if not self.lost.is_set():
            try:
                await self._request("DELETE", f"/v1/sessions/{self.id}")
            except SessionLost:
                pass
            finally:
                await self._http.aclose()
        else:
            await self._http.aclose()

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(
        self, kind: Optional[Type[BaseException]], value: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        if os.getpid() != self._pid:
            return  # a forked child leaves its parent's session alone
        try:
            await self.close()
        except PermitError as error:
            if kind is None:
                raise
            log.debug("closing session %s: %s", self.id, error)


class _Ask(KeepaliveAsk):
    def __init__(self, session_id: str, timeout: float) -> None:
        super().__init__(session_id, timeout)
        self.done = asyncio.Event()

    def _notify(self) -> None:
        self.done.set()


class _Batcher(KeepaliveBatcher):
    """A client's keepalive batcher: a short-lived task sends the batches while asks keep
    coming (see :class:`permit._common.KeepaliveBatcher`)."""

    def __init__(self, client: Client) -> None:
        super().__init__()
        self._client = client

    async def keepalive(self, session: "Session", timeout: float, wait: float) -> Outcome:
        """Keeps ``session`` alive through the next batch (or alone, on an older server);
        ``timeout`` bounds the request, ``wait`` the wait for the answer."""
        if not self.unbatched():
            ask = _Ask(session.id, timeout)
            if self.put(ask):
                spawn(self._send_batches, "permit-keepalive-batch")
            try:
                await wait_event(ask.done, wait, session._stop)
            finally:
                if not ask.done.is_set():
                    ask.abandoned = True
            if not ask.done.is_set():
                return ClusterUnavailable("timeout", 0, "the batched keepalive was not answered in time")
            if not ask.unsupported:
                assert ask.outcome is not None
                return ask.outcome
        sent = time.monotonic()
        try:
            _, answer = await session._request("POST", f"/v1/sessions/{session.id}/keepalive", policy=ONE_PASS, timeout=timeout)
        except PermitError as error:
            return error
        return Renewal(sent, answer["ttl_ms"] / 1000.0)

    async def _send_batches(self) -> None:
        asks: Optional[List[KeepaliveAsk]] = None
        try:
            while True:
                # Sessions due soon join this batch rather than the next one.
                await wait_riders(self, self.depart())
                asks = self.take()
                if asks is None:
                    return
                if self.unsupported_now(asks):
                    continue
                ids, timeout = self.request(asks)
                # Taken before the request leaves: every renewal it carries happens after it.
                sent = time.monotonic()
                try:
                    _, body = await self._client._request(
                        "POST", "/v1/sessions/keepalive", json={"sessions": ids}, policy=ONE_PASS, timeout=timeout
                    )
                except PermitError as error:
                    self.settle(asks, ids, sent, error=error)
                    continue
                self.settle(asks, ids, sent, body=body)
        except BaseException as error:
            if not is_cancellation(error):
                log.warning("the keepalive batcher failed: %r", error)
            self.stopped(asks or [])
            raise


def _call(callback: OnLost, error: SessionLost) -> None:
    try:
        callback(error)
    except Exception:  # a user callback must not break the keepalive task
        log.exception("permit on_lost callback failed")


class _Lease:
    """What a session's leases share (permits, leaderships, claimed items): the fencing token
    and the loss signal."""

    def __init__(self, session: Session, name: str, token: int, on_lost: Optional[OnLost]) -> None:
        self.session = session
        self.name = name
        self._token = token
        self.lost = asyncio.Event()
        self._on_lost = on_lost
        self._released = False
        self._expires: Optional[float] = None
        self._error: Optional[SessionLost] = None

    @property
    def token(self) -> int:
        """The fencing token; raises :class:`permit.SessionLost` once the hold (or claim) is lost.

        Example::

            storage.write(data, fence=p.token)
        """
        self.check()
        return self._token

    def check(self) -> None:
        """Raises :class:`permit.SessionLost` if the hold (or claim) is known or presumed lost.

        Example::

            for chunk in work:
                p.check()
                process(chunk)
        """
        if self.lost.is_set():
            raise self._error or SessionLost("session_lost", 0, f"{self.name}: lost")

    def _mark_lost(self, error: SessionLost) -> None:
        if self._released or self.lost.is_set():
            return
        self._error = SessionLost(error.code, error.status, f"{self.name}: {error.message}")
        self.lost.set()
        if self._on_lost is not None:
            _call(self._on_lost, self._error)


class _Hold(_Lease):
    """What a permit and a leadership share: release on exit."""

    _kind = "semaphores"
    _action = "release"

    async def release(self) -> None:
        """Gives the hold back (idempotent; a lost hold needs nothing).

        Example::

            p = await session.acquire("gpu")
            try:
                do_work(p.token)
            finally:
                await p.release()
        """
        if self._released:
            return
        check_pid(self.session._pid, self.session.id)
        self._released = True
        self.session._forget(self)
        try:
            if self.lost.is_set() or self.session.lost.is_set() or self.session._closed:
                return
            try:
                await self.session._request(
                    "POST", f"/v1/{self._kind}/{segment(self.name)}/{self._action}", json={"session": self.session.id}
                )
            except SessionLost as error:
                self.session._lose(error)
        finally:
            # Only once the release is answered: an acquire before that would get this grant.
            self.session._claims.unclaim(self._kind, self.name)

    async def __aexit__(
        self, kind: Optional[Type[BaseException]], value: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        try:
            await self.release()
        except PermitError as error:
            if kind is None:
                raise
            log.warning("releasing %s failed: %s", self.name, error)


class Permit(_Hold):
    """Permits of a semaphore held by a session: ``token`` (fencing), ``permits``, ``lost``
    (an ``asyncio.Event``); a context manager that releases on exit, also on an exception.

    Example::

        async with session.acquire("gpu", permits=2) as p:
            assert p.permits == 2
            do_work(p.token)
    """

    def __init__(self, session: Session, name: str, permits: int, token: int, on_lost: Optional[OnLost]) -> None:
        super().__init__(session, name, token, on_lost)
        self.permits = permits

    async def __aenter__(self) -> "Permit":
        return self

    def __repr__(self) -> str:
        return f"Permit(name={self.name!r}, permits={self.permits}, token={self._token}, lost={self.lost.is_set()})"


class Leadership(_Hold):
    """Leadership of an election: ``token``, ``value``, ``lost``; resigns on exit.

    Example::

        async with session.campaign("scheduler", value="host-a") as leadership:
            while not leadership.lost.is_set():
                schedule(leadership.token)
    """

    _kind = "elections"
    _action = "resign"

    def __init__(self, session: Session, name: str, value: str, token: int, on_lost: Optional[OnLost]) -> None:
        super().__init__(session, name, token, on_lost)
        self.value = value

    async def __aenter__(self) -> "Leadership":
        return self

    async def proclaim(self, value: str) -> None:
        """Publishes ``value`` in place of the current one and keeps leading, with the same
        ``token`` (etcd's ``Proclaim``): :meth:`Client.leader` and ``observe_leader`` see the
        new value. ``self.value`` follows what the server confirmed. Raises
        :class:`permit.Conflict` ``not_leader`` when the session no longer leads (revoked, or
        resigned; nothing changes), ``feature_unavailable`` when a cluster member runs a build
        older than feature version 3, :class:`permit.InvalidRequest` for a value over 4096
        bytes, :class:`permit.SessionLost` once the leadership is lost.

        Example::

            await leadership.proclaim("host-a:8081")
            assert leadership.value == "host-a:8081"
        """
        check_pid(self.session._pid, self.session.id)
        if self._released:
            raise Conflict("not_leader", 0, f"{self.name}: this leadership was resigned")
        self.check()
        try:
            _, body = await self.session._request(
                "POST",
                f"/v1/{self._kind}/{segment(self.name)}/proclaim",
                json={"session": self.session.id, "value": value},
            )
        except SessionLost as error:
            self.session._lose(error)
            raise
        self.value = body["value"]

    async def resign(self) -> None:
        """Steps down (the next candidate becomes leader).

        Example::

            await leadership.resign()
        """
        await self.release()

    def __repr__(self) -> str:
        return f"Leadership(name={self.name!r}, token={self._token}, lost={self.lost.is_set()})"


class Item(_Lease):
    """An item claimed by a session (:meth:`Session.claim`): ``payload`` (as pushed), ``id``,
    ``seq``, ``queue``, ``attempt`` (claims of it so far, 1 on the first), ``token`` (this
    claim's fencing token, from the counter of semaphore grants), ``lost``
    (an ``asyncio.Event``, set when the session is lost: the server then makes the item
    pending again). A context manager: a clean exit acks, an exception nacks with the exception's text
    as ``error`` (a lost item needs nothing; an ack or nack inside the block is the last word).

    Example::

        async with session.claim("jobs", timeout=30.0) as item:
            print(item.id, item.attempt, item.payload)
            await sink.write(item.payload, fence=item.token)
    """

    def __init__(self, session: Session, queue: str, claimed: Dict[str, Any], on_lost: Optional[OnLost]) -> None:
        super().__init__(session, queue, claimed["token"], on_lost)
        self.queue = queue
        self.id: str = claimed["id"]
        self.seq: int = claimed["seq"]
        self.attempt: int = claimed["attempt"]
        self.payload: Any = claimed["payload"]
        self._settled = False

    async def __aenter__(self) -> "Item":
        return self

    async def ack(self) -> None:
        """Settles the item for good: it is gone from the queue. Raises
        :class:`permit.Conflict` ``claim_lost`` when this claim no longer owns it (nacked,
        removed, or its session ended and it was claimed again; an ack after a retried request
        may also mean the first one was applied) and :class:`permit.SessionLost` once the item
        is lost: then the work may be done again by another worker.

        Example::

            item = await session.claim("jobs")
            await process(item.payload)
            await item.ack()
        """
        await self._settle("ack", {})

    async def ack_and_claim(self, timeout: Optional[float] = None, *, on_lost: Optional[OnLost] = None) -> Optional["Item"]:
        """Acks the item and claims the session's next item of the same queue in the same
        request (one round trip and one log entry instead of two): answers the next
        :class:`Item`, or ``None`` when none came within ``timeout`` seconds (``None`` waits
        forever, ``0`` takes only an item due now). The ack and the claim are applied together
        or not at all; once applied the ack stands, whatever happens to the claim (a claim
        cancelled or failed after it is ended on the server, and what it took is given back).
        On a cluster older than feature version 6 it acks, then claims, in two requests.
        Raises as :meth:`ack` (nothing was claimed then), then as :meth:`Session.claim_many`.

        Example::

            item = await session.claim("jobs", timeout=30.0)
            while item is not None:
                await process(item.payload, fence=item.token)
                item = await item.ack_and_claim(timeout=30.0)
        """
        session = self.session
        try_once = timeout is not None and timeout <= 0
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = wait_slice(deadline, try_once, session.ttl)
        request_id = claim_request_id()
        claim = {"max": 1, "wait_ms": ms(wait), "request_id": request_id}
        # Whether the claim may wait or hold items on the server that this call has not answered.
        armed = False
        try:
            try:
                armed = True
                answer = await unless_set(
                    self._settle(
                        "ack", {"claim": claim}, timeout=max(session.client.timeout, wait + LONG_POLL_MARGIN)
                    ),
                    session.lost,
                    SessionLost("session_lost", 0, f"session {session.id} is lost"),
                )
            except Conflict as error:
                armed = False
                if error.code != "feature_unavailable":
                    raise
                await self.ack()
                answer = {"items": []}
            except PermitError as error:
                # Unanswered (no node answered in the retry window), the ack and its claim may
                # have applied: end the claim on the server. An answer is the last word.
                armed = isinstance(error, ClusterUnavailable)
                raise
            armed = False
        finally:
            if armed:
                await session._abandon_claim(self.queue, request_id)
        items = [Item(session, self.queue, raw, on_lost) for raw in answer.get("items") or []]
        for item in items:
            session._adopt(item)
        if items:
            return items[0]
        if try_once or (deadline is not None and time.monotonic() >= deadline):
            return None
        left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
        more = await session._claim(self.queue, 1, left, on_lost)
        return more[0] if more else None

    async def nack(self, delay: float = 0.0, error: Optional[str] = None) -> str:
        """Gives the item back: pending again in its ``seq`` place (after ``delay`` seconds),
        or moved to the dead-letter queue when this was its ``max_attempts``-th claim; ``error``
        (at most 1024 bytes) is kept with it as ``last_error``. Answers where it went:
        ``"pending"``, ``"delayed"`` or ``"dead"``. Raises as :meth:`ack`.

        Example::

            if await item.nack(delay=30.0, error="upstream busy") == "dead":
                log.error("gave up on %s", item.id)
        """
        body: Dict[str, Any] = {}
        if delay:
            body["delay_ms"] = ms(delay)
        if error is not None:
            body["error"] = error
        answer = await self._settle("nack", body)
        return str(answer["state"])

    async def _settle(self, verb: str, extra: Dict[str, Any], timeout: Optional[float] = None) -> Any:
        check_pid(self.session._pid, self.session.id)
        if self._settled:
            raise Conflict("claim_lost", 0, f"queue {self.queue} item {self.id}: already acked or nacked")
        if self.session._closed:
            raise SessionLost("session_closed", 0, f"queue {self.queue} item {self.id}: its session was closed")
        self.check()
        path = f"/v1/queues/{segment(self.queue)}/items/{segment(self.id)}/{verb}"
        try:
            _, answer = await self.session._request(
                "POST", path, json={"session": self.session.id, "token": self._token, **extra}, timeout=timeout
            )
        except SessionLost as error:
            self.session._lose(error)
            raise
        except Conflict as error:
            if error.code == "claim_lost":
                self._end()
            raise
        self._end()
        return answer

    def _end(self) -> None:
        self._settled = True
        self.session._forget(self)

    async def __aexit__(
        self, kind: Optional[Type[BaseException]], value: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        if self._settled or os.getpid() != self.session._pid:
            return  # settled in the block; a forked child leaves its parent's claim alone
        if kind is None:
            await self.ack()
            return
        if self.lost.is_set() or self.session.lost.is_set() or self.session._closed:
            return  # pending again on the server already
        try:
            await self.nack(error=exception_text(kind, value))
        except PermitError as error:
            log.warning("nacking queue %s item %s failed: %s", self.queue, self.id, error)

    def __repr__(self) -> str:
        return (
            f"Item(queue={self.queue!r}, id={self.id!r}, attempt={self.attempt}, token={self._token}, "
            f"lost={self.lost.is_set()})"
        )


class LeaderWatch:
    """What :meth:`Client.observe_leader` returns: an async iterator of the election's leader
    (:class:`permit.Leader` or ``None``), each change once, and an async context manager.
    ``aclose`` ends it; a close from elsewhere takes effect when the blocking read in progress
    returns (within 30 s, or at once when the leader changes).

    Example::

        async for leader in client.observe_leader("scheduler", timeout=60.0):
            print(leader)
    """

    def __init__(self, client: Client, election: str, timeout: Optional[float]) -> None:
        self._client = client
        self._tracker = LeaderTracker(election, timeout)
        self._closed = False

    def __aiter__(self) -> "LeaderWatch":
        return self

    async def __anext__(self) -> Optional[Leader]:
        while not self._closed:
            read = self._tracker.next_read()
            if read is None:
                break
            params, wait = read
            _, body = await self._client._request(
                "GET", self._tracker.path, params=params or None, timeout=wait + LONG_POLL_MARGIN if params else None
            )
            if self._closed:
                break
            changed, leader = self._tracker.answer(body)
            if changed:
                return leader
        self._closed = True
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Stops the watch (idempotent).

        Example::

            await leaders.aclose()
        """
        self._closed = True

    async def __aenter__(self) -> "LeaderWatch":
        return self

    async def __aexit__(
        self, kind: Optional[Type[BaseException]], value: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        await self.aclose()


class EventStream:
    """What :meth:`Client.events` returns: an async iterator of :class:`permit.Event` over one
    connection (opened at the first ``__anext__``), and an async context manager that closes
    it. ``last_id`` is the seq of the last event received (pass it as ``after`` to resume).

    Example::

        stream = client.events(prefix="gpu")
        try:
            async for event in stream:
                print(event.kind, event.data.get("session_name"))
        except permit.ClusterUnavailable:
            stream = client.events(prefix="gpu", after=stream.last_id)   # resume
    """

    def __init__(self, client: Client, params: Dict[str, Any], after: Optional[int]) -> None:
        self._client = client
        self._params = params
        self.last_id = after
        self._parser = SseParser()
        self._http: Optional[httpx.AsyncClient] = None
        self._response: Optional[httpx.Response] = None
        self._lines: Optional[AsyncIterator[str]] = None
        self._endpoint = ""
        self._closed = False

    async def _open(self) -> AsyncIterator[str]:
        # A pool of its own: closing the stream closes only its connection.
        self._http = self._client._new_pool()
        headers = {"Last-Event-ID": str(self.last_id)} if self.last_id is not None else {}
        endpoints = self._client.endpoints
        failure: Optional[PermitError] = None
        for step in range(len(endpoints)):
            endpoint = endpoints[(self._client._preferred + step) % len(endpoints)]
            request = self._http.build_request(
                "GET",
                endpoint + "/v1/events",
                params=self._params,
                headers=headers,
                timeout=httpx.Timeout(STREAM_READ_TIMEOUT, connect=2.0),
            )
            try:
                response = await self._http.send(request, stream=True)
            except httpx.TransportError as error:
                failure = transport_failure(endpoint, error).error
                continue
            if response.status_code >= 300:
                await response.aread()
                await response.aclose()
                raise answer_failure(endpoint, response).error
            self._endpoint, self._response = endpoint, response
            return response.aiter_lines()
        assert failure is not None
        raise failure

    def __aiter__(self) -> "EventStream":
        return self

    async def __anext__(self) -> Event:
        if self._closed:
            raise StopAsyncIteration
        try:
            if self._lines is None:
                self._lines = await self._open()
            async for line in self._lines:
                event = self._parser.line(self._endpoint, line)
                if event is not None:
                    if event.id is not None:
                        self.last_id = event.id
                    return event
        except httpx.TransportError as error:
            await self.aclose()
            raise transport_failure(self._endpoint, error).error from None
        except BaseException:
            await self.aclose()
            raise
        # The server ended the stream: its ``wait_ms`` passed (or it is shutting down).
        await self.aclose()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Closes the connection (idempotent); the iteration stops.

        Example::

            await stream.aclose()
        """
        self._closed = True
        response, http = self._response, self._http
        self._response, self._http = None, None
        if response is not None:
            await response.aclose()
        if http is not None:
            await http.aclose()

    async def __aenter__(self) -> "EventStream":
        return self

    async def __aexit__(
        self, kind: Optional[Type[BaseException]], value: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        await self.aclose()


__all__ = [
    "Client",
    "Session",
    "Pending",
    "LeaderWatch",
    "EventStream",
    "Event",
    "Permit",
    "Leadership",
    "Item",
    "OnLost",
    "SemaphoreInfo",
    "Rate",
    "RateInfo",
    "DelayedPermits",
    "GroupInfo",
    "KEEP",
    "QueueInfo",
    "ItemInfo",
    "Pushed",
    "NewItem",
    "Holder",
    "Waiter",
    "Leader",
    "PermitError",
    "InvalidRequest",
    "NotFound",
    "Conflict",
    "Unavailable",
    "LimitExceeded",
    "RateLimited",
    "AuthError",
    "ClusterUnavailable",
    "InternalError",
    "Timeout",
    "SessionLost",
    "SessionForked",
]
