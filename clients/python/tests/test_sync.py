"""The blocking client against a real single-node server."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import List

import httpx
import pytest

import permit
from conftest import KeepaliveCounts, Server, batch_route_refused, eventually, metric_sum, metrics, own_server, unavailable


def test_acquire_holds_and_release_frees(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session(ttl=5.0, name="t1") as session:
        with session.acquire(name, permits=2, capacity=8, ephemeral=False, timeout=5.0) as p:
            assert p.permits == 2 and p.token > 0 and not p.lost.is_set()
            info = client.semaphore(name)
            assert (info.capacity, info.held, info.available) == (8, 2, 6)
            assert [(h.session, h.permits, h.token) for h in info.holders] == [(session.id, 2, p.token)]
            assert info.holders[0].session_name == "t1"
            assert client.validate(name, p.token)
        assert client.semaphore(name).holders == ()
        assert not client.validate(name, p.token)


def test_try_acquire_never_queues(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session() as a, client.session() as b:
        held = a.try_acquire(name, capacity=1, ephemeral=False)
        assert held is not None
        assert b.try_acquire(name) is None
        assert client.semaphore(name).waiters == ()
        with pytest.raises(permit.Unavailable) as raised:
            b.acquire(name, timeout=0)
        assert raised.value.code == "unavailable" and raised.value.status == 409
        held.release()
        again = b.try_acquire(name)
        assert again is not None and again.token > held._token


def test_tokens_grow(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session() as session:
        tokens = []
        for _ in range(5):
            with session.acquire(name, capacity=1) as p:
                tokens.append(p.token)
        assert tokens == sorted(tokens) and len(set(tokens)) == 5


def test_capacity_never_exceeded_by_threads(server: Server, name: str) -> None:
    capacity, workers, rounds = 3, 8, 4
    client = permit.Client(server.url)
    client.set_capacity(name, capacity)
    lock = threading.Lock()
    state = {"now": 0, "max": 0, "grants": 0}
    errors: List[BaseException] = []

    def worker(i: int) -> None:
        try:
            with client.session(ttl=5.0) as session:
                for r in range(rounds):
                    weight = 1 + (i + r) % 2
                    with session.acquire(name, permits=weight, timeout=20.0):
                        with lock:
                            state["now"] += weight
                            state["max"] = max(state["max"], state["now"])
                            state["grants"] += 1
                        time.sleep(0.002)  # hold briefly so that holds overlap
                        with lock:
                            state["now"] -= weight
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    client.close()
    assert not errors, errors
    assert state["grants"] == workers * rounds
    assert 1 <= state["max"] <= capacity


def test_strict_fifo_order(server: Server, name: str) -> None:
    client = permit.Client(server.url)
    holder = client.session()
    first = holder.acquire(name, capacity=1)
    order: List[str] = []
    sessions = [client.session(name=f"w{i}") for i in range(4)]
    threads = []

    def wait(session: permit.Session) -> None:
        with session.acquire(name, timeout=20.0):
            order.append(session.id)

    for i, session in enumerate(sessions):
        t = threading.Thread(target=wait, args=(session,))
        t.start()
        threads.append(t)
        # The next waiter starts only once this one is queued, so the queue order is known.
        assert eventually(lambda: len(client.semaphore(name).waiters) == i + 1)
    assert [w.session for w in client.semaphore(name).waiters] == [s.id for s in sessions]
    first.release()
    for t in threads:
        t.join(20)
    assert order == [s.id for s in sessions]
    for s in sessions + [holder]:
        s.close()
    client.close()


def test_blocking_acquire_is_pushed_not_polled(server: Server, name: str) -> None:
    client = permit.Client(server.url)
    holder = client.session()
    first = holder.acquire(name, capacity=1)
    route = 'route="/v1/semaphores/{name}/acquire"'
    before = metrics(server.url)
    waiters = [client.session() for _ in range(3)]
    granted: List[float] = []
    threads = []
    for s in waiters:

        def wait(s: permit.Session = s) -> None:
            with s.acquire(name, timeout=30.0):
                granted.append(time.monotonic())

        t = threading.Thread(target=wait)
        t.start()
        threads.append(t)
    assert eventually(lambda: len(client.semaphore(name).waiters) == 3)
    # Every waiter keeps exactly one request open on the server and none completes while
    # it waits: a polling client would finish 202 answers and open new requests.
    observed_until = time.monotonic() + 1.0
    while time.monotonic() < observed_until:
        now = metrics(server.url)
        done = metric_sum(now, "permit_http_requests_total", route) - metric_sum(before, "permit_http_requests_total", route)
        assert done == 0, f"{done} acquire requests completed while waiting"
        assert now["permit_waiters"] >= 3
        assert now["permit_connections_open"] >= 3
        time.sleep(0.1)
    released_at = time.monotonic()
    first.release()
    for t in threads:
        t.join(20)
    assert len(granted) == 3 and granted[0] - released_at < 1.0
    after = metrics(server.url)
    assert metric_sum(after, "permit_http_requests_total", route, 'status="200"') - metric_sum(
        before, "permit_http_requests_total", route, 'status="200"'
    ) == 3
    assert metric_sum(after, "permit_http_requests_total", route, 'status="202"') == metric_sum(
        before, "permit_http_requests_total", route, 'status="202"'
    )
    for s in waiters + [holder]:
        s.close()
    client.close()


def test_timeout_gives_the_place_up(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session() as a, client.session() as b:
        held = a.acquire(name, capacity=1, ephemeral=False)
        started = time.monotonic()
        with pytest.raises(permit.Timeout) as raised:
            b.acquire(name, timeout=0.3)
        assert 0.25 <= time.monotonic() - started < 5.0
        assert raised.value.code == "wait_timeout"
        assert client.semaphore(name).waiters == ()
        held.release()
        assert client.semaphore(name).holders == ()


def test_session_deleted_server_side_sets_lost_within_ttl(server: Server, name: str) -> None:
    calls: List[permit.SessionLost] = []
    with permit.Client(server.url) as client:
        session = client.session(ttl=1.0, on_lost=calls.append)
        p = session.acquire(name, capacity=1, on_lost=calls.append)
        deleted = time.monotonic()
        assert httpx.delete(f"{server.url}/v1/sessions/{session.id}", trust_env=False).status_code == 204
        assert p.lost.wait(2.0)
        assert time.monotonic() - deleted <= 1.0 + 0.2
        assert session.lost.is_set() and session.state == "lost"
        assert len(calls) == 2 and all(isinstance(c, permit.SessionLost) for c in calls)
        with pytest.raises(permit.SessionLost):
            p.token
        with pytest.raises(permit.SessionLost):
            session.acquire(name)
        p.release()  # nothing to release, no error
        session.close()


def test_exception_in_body_still_releases(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session() as session:
        with pytest.raises(ZeroDivisionError):
            with session.acquire(name, capacity=1, ephemeral=False):
                1 / 0
        assert client.semaphore(name).holders == ()


def test_session_close_releases_everything(server: Server, name: str) -> None:
    with permit.Client(server.url) as client:
        session = client.session()
        p = session.acquire(name, capacity=2, ephemeral=False)
        session.close()
        assert session.state == "closed"
        assert client.semaphore(name).holders == ()
        p.release()
        with pytest.raises(permit.SessionLost) as raised:
            session.try_acquire(name)
        assert raised.value.code == "session_closed"


def test_keepalive_outlives_the_ttl(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session(ttl=0.6) as session:
        p = session.acquire(name, capacity=1)
        start = time.monotonic()
        # Three TTLs of acknowledged keepalives, each pushing the local deadline on.
        assert eventually(lambda: session.deadline > start + 3 * 0.6, timeout=5.0)
        assert not p.lost.is_set() and client.validate(name, p.token)


def test_unreachable_server_is_presumed_lost_at_the_local_deadline(name: str) -> None:
    with tempfile.TemporaryDirectory() as temp:
        node = Server(Path(temp) / "data", [])
        try:
            client = permit.Client(node.url)
            lost = threading.Event()
            session = client.session(ttl=0.9, on_lost=lambda error: lost.set())
            p = session.acquire(name, capacity=1)
            os.kill(node.proc.pid, signal.SIGSTOP)
            try:
                stopped = time.monotonic()
                assert eventually(lambda: session.state in ("jeopardy", "lost"), timeout=2.0)
                assert p.lost.wait(2.0)
                # Presumed lost no later than TTL after the last acknowledged keepalive.
                assert time.monotonic() - stopped <= 0.9 + 0.3
                assert lost.is_set()
            finally:
                os.kill(node.proc.pid, signal.SIGCONT)
            client.close()
        finally:
            node.kill9()


def test_max_hold_marks_the_permit_lost(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session(ttl=5.0) as session:
        p = session.acquire(name, capacity=1, ephemeral=False, max_hold=0.3)
        assert p.lost.wait(2.0)
        assert eventually(lambda: client.semaphore(name).holders == ())
        assert not session.lost.is_set()


def test_campaign_leads_and_resign_hands_over(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session() as a, client.session() as b:
        assert client.leader(name) is None
        with a.campaign(name, value="host-a") as leading:
            assert client.leader(name) == (a.id, "host-a", leading.token)
            with pytest.raises(permit.Timeout):
                b.campaign(name, value="host-b", timeout=0.2)
            with pytest.raises(permit.Unavailable):
                b.campaign(name, value="host-b", timeout=0)
            got: List[permit.Leadership] = []
            t = threading.Thread(target=lambda: got.append(b.campaign(name, value="host-b", timeout=20.0)))
            t.start()
            assert eventually(lambda: httpx.get(f"{server.url}/v1/elections/{name}", trust_env=False).json()["candidates"] == 1)
        t.join(20)
        assert got and got[0].token > leading.token
        session, value, token = client.leader(name) or ("", "", 0)
        assert (session, value, token) == (b.id, "host-b", got[0].token)
        got[0].resign()
        assert client.leader(name) is None


def test_errors_are_typed(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session() as session:
        with pytest.raises(permit.NotFound) as missing:
            client.semaphore(name)
        assert (missing.value.code, missing.value.status) == ("semaphore_not_found", 404)
        with pytest.raises(permit.InvalidRequest) as bad:
            client.set_capacity("bad name!", 1)
        assert bad.value.code == "invalid_name" and bad.value.message
        with pytest.raises(permit.InvalidRequest) as zero:
            client.set_capacity(name, 0)
        assert zero.value.code in ("invalid_argument", "invalid_body")
        client.set_capacity(name, 2)
        with pytest.raises(permit.Conflict) as too_many:
            session.acquire(name, permits=3)
        assert too_many.value.code == "permits_exceed_capacity"
        with pytest.raises(permit.NotFound):
            session.acquire(name + ".none")
        # The failed acquires left nothing behind.
        assert client.semaphore(name).waiters == ()


def test_every_server_error_code_is_mapped() -> None:
    import json
    from conftest import REPO

    spec = json.loads((REPO / "docs" / "openapi.json").read_text())
    codes = spec["components"]["schemas"]["ErrorCode"]["enum"]
    assert sorted(codes) == sorted(permit.CODES)
    from permit._errors import error_for

    for code in codes:
        error = error_for(code, 400, "m")
        assert type(error) is permit.CODES[code] and error.code == code
    unknown = error_for("from_the_future", 418, "new")
    assert type(unknown) is permit.PermitError and (unknown.code, unknown.status) == ("from_the_future", 418)


def test_fails_over_to_the_next_endpoint(server: Server, name: str) -> None:
    dead = Server.__new__(Server)  # an address nobody listens on: bind, note, close
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    dead_url = "http://127.0.0.1:%d" % sock.getsockname()[1]
    sock.close()
    del dead
    with permit.Client([dead_url, server.url]) as client, client.session() as session:
        with session.acquire(name, capacity=1) as p:
            assert client.validate(name, p.token)
        assert client.endpoints == [dead_url, server.url]


def test_endpoints_are_checked() -> None:
    assert permit.Client("127.0.0.1:7376").endpoints == ["http://127.0.0.1:7376"]
    assert permit.Client("http://a:1,http://b:2").endpoints == ["http://a:1", "http://b:2"]
    for bad in ["ftp://x:1", "http://x:1/path", "http://u:p@x:1", ""]:
        with pytest.raises(ValueError):
            permit.Client(bad)


def test_auth_token_is_sent(name: str) -> None:
    with tempfile.TemporaryDirectory() as temp:
        data = Path(temp) / "data"
        node = Server(data, ["--auth"])
        try:
            root = eventually(lambda: (data / "root-token").exists()) and (data / "root-token").read_text().strip()
            assert root
            with permit.Client(node.url) as anonymous:
                with pytest.raises(permit.AuthError) as refused:
                    anonymous.session()
                assert (refused.value.code, refused.value.status) == ("unauthenticated", 401)
            with permit.Client(node.url, auth_token=root) as client, client.session() as session:
                with session.acquire(name, capacity=1) as p:
                    assert client.validate(name, p.token)
        finally:
            node.kill9()


def test_ephemeral_and_delete(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session() as session:
        with session.acquire(name, capacity=2, ephemeral=True):
            assert client.semaphore(name).capacity == 2
        with pytest.raises(permit.NotFound):
            client.semaphore(name)
        client.set_capacity(name, 1)
        with session.acquire(name):
            with pytest.raises(permit.Conflict) as busy:
                client.delete_semaphore(name)
            assert busy.value.code == "semaphore_busy"
        client.delete_semaphore(name)
        with pytest.raises(permit.NotFound):
            client.semaphore(name)


def test_keepalive_many_renews_each_session_and_reports_the_unknown_alone(server: Server) -> None:
    a = httpx.post(server.url + "/v1/sessions", json={"ttl_ms": 60000}).json()["id"]
    b = httpx.post(server.url + "/v1/sessions", json={"ttl_ms": 5000}).json()["id"]
    unknown = "0" * 32
    with permit.Client(server.url) as client:
        results = client.keepalive_many([a, unknown, b])
        assert list(results) == [a, unknown, b]
        assert (results[a], results[b]) == (60.0, 5.0)
        error = results[unknown]
        assert isinstance(error, permit.SessionLost) and error.code == "session_not_found"
        with pytest.raises(permit.InvalidRequest) as raised:
            client.keepalive_many([a, "not-a-session"])
        assert raised.value.code == "invalid_argument"
        assert client.keepalive_many([]) == {}
        httpx.delete(f"{server.url}/v1/sessions/{a}")
        httpx.delete(f"{server.url}/v1/sessions/{b}")


SESSIONS = 6
TTL = 0.9


def test_background_keepalives_of_one_client_share_requests(name: str) -> None:
    with tempfile.TemporaryDirectory() as temp:
        node = own_server(temp)
        try:
            with permit.Client(node.url) as client:
                sessions = [client.session(ttl=TTL) for _ in range(SESSIONS)]
                holds = [s.acquire(name, capacity=SESSIONS) for s in sessions]
                start = time.monotonic()
                # Several TTLs of acknowledged keepalives, each pushing every deadline on.
                assert eventually(lambda: all(s.deadline > start + 3 * TTL for s in sessions), timeout=15.0)
                assert [s.state for s in sessions] == ["alive"] * SESSIONS
                assert not any(h.lost.is_set() for h in holds) and all(client.validate(name, h.token) for h in holds)
                seen = KeepaliveCounts(node.url)
                # Each session renewed at least twice after the start, in shared requests: at
                # least two renewals per request on average, none of them one per session.
                assert seen.renewals >= 2 * SESSIONS, seen
                assert seen.batched > 0 and seen.single == 0, seen
                assert 2 * seen.requests <= seen.renewals, seen
                # A session the server no longer knows is lost alone; its batch-mates live on.
                gone, rest = sessions[0], sessions[1:]
                assert httpx.delete(f"{node.url}/v1/sessions/{gone.id}", trust_env=False).status_code == 204
                assert holds[0].lost.wait(3 * TTL) and gone.state == "lost"
                later = time.monotonic()
                assert eventually(lambda: all(s.deadline > later + TTL for s in rest), timeout=10.0)
                assert [s.state for s in rest] == ["alive"] * (SESSIONS - 1)
                assert not any(h.lost.is_set() for h in holds[1:])
                for s in sessions:
                    s.close()
        finally:
            node.kill9()


def test_background_keepalives_fall_back_to_one_per_session_on_an_older_server(name: str) -> None:
    with tempfile.TemporaryDirectory() as temp:
        node = own_server(temp, {"PERMIT_INJECT_BUG": "no_keepalive_batch"})
        try:
            if not batch_route_refused(node.url):
                unavailable("this permit binary has no bug injection (a test build has it)")
            with permit.Client(node.url) as client:
                sessions = [client.session(ttl=TTL) for _ in range(3)]
                start = time.monotonic()
                assert eventually(lambda: all(s.deadline > start + 3 * TTL for s in sessions), timeout=15.0)
                assert [s.state for s in sessions] == ["alive"] * 3
                seen = KeepaliveCounts(node.url)
                # The route was tried once (plus the probe above), then not again for 60 s.
                assert seen.batch_refused == 2 and seen.batched == 0, seen
                assert seen.single >= 2 * 3 and seen.renewals == seen.single, seen
                for s in sessions:
                    s.close()
        finally:
            node.kill9()


def test_a_second_acquire_of_a_held_name_fails_and_never_frees_the_outer_hold(server: Server, name: str) -> None:
    # The server answers a repeated acquire with the grant the session has; a second guard for it
    # would release the outer hold on its exit, and another session would take the lock.
    with permit.Client(server.url) as client, client.session() as session, client.session() as other:
        with session.acquire(name, capacity=1, ephemeral=False) as outer:
            with pytest.raises(permit.AlreadyHeld) as raised:
                with session.acquire(name):
                    pass
            assert raised.value.code == "already_held" and name in raised.value.message
            with pytest.raises(permit.AlreadyHeld):
                session.try_acquire(name)
            outer.check()
            assert other.try_acquire(name) is None, "the outer hold is intact"
            assert client.validate(name, outer.token)
        with session.campaign(name + ".leader", "a"):
            with pytest.raises(permit.AlreadyHeld):
                session.campaign(name + ".leader", "b")
        # Released: the name can be acquired again on the same session.
        with session.acquire(name) as again:
            assert again.token > outer._token


def test_an_acquire_in_flight_claims_its_name(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session() as session, client.session() as other:
        blocker = other.acquire(name, capacity=1)
        granted: List[int] = []
        waiter = threading.Thread(target=lambda: granted.append(session.acquire(name, timeout=10.0).token))
        waiter.start()
        assert eventually(lambda: len(client.semaphore(name).waiters) == 1)
        with pytest.raises(permit.AlreadyHeld):
            session.try_acquire(name)
        blocker.release()
        waiter.join(10.0)
        assert len(granted) == 1 and granted[0] > 0


def test_a_blocked_acquire_rides_out_an_outage_shorter_than_the_session() -> None:
    """Issue 29, finding 2: a blocked acquire survives the cluster being down for longer than
    the request's own retries (≈ 6 s) but shorter than the session, keeping its place; an outage
    longer than the session ends it with SessionLost."""
    with tempfile.TemporaryDirectory(prefix="permit-py-outage-") as temp:
        node = Server(Path(temp) / "data", [])
        try:
            with permit.Client(node.url) as client:
                holder = client.session(ttl=30.0)
                held = holder.acquire("outage", capacity=1)
                waiter = client.session(ttl=30.0)
                short = client.session(ttl=2.0)
                outcome: List[object] = []

                def wait(session: permit.Session) -> None:
                    try:
                        outcome.append(session.acquire("outage", timeout=60))
                    except permit.PermitError as error:
                        outcome.append(error)

                threads = [threading.Thread(target=wait, args=(s,), daemon=True) for s in (waiter, short)]
                for thread in threads:
                    thread.start()
                assert eventually(lambda: len(client.semaphore("outage").waiters) == 2)
                node.kill9()
                time.sleep(7.5)  # the outage itself, longer than the retries of one request
                assert threads[0].is_alive(), outcome
                node = Server(Path(temp) / "data", [], listen=node.addr)
                threads[1].join(10)
                assert len(outcome) == 1 and isinstance(outcome[0], permit.SessionLost), outcome
                held.release()
                threads[0].join(20)
                assert len(outcome) == 2 and isinstance(outcome[1], permit.Permit), outcome
                assert outcome[1].session is waiter
                outcome[1].release()
                holder.close()
                waiter.close()
        finally:
            node.kill9()
