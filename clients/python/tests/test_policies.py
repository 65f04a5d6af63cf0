"""Semaphore policies through the client, blocking and asyncio, against a real server: takes
with and without a rate (``RateLimited``, a waiting take served, a take whose wait passes),
the round trip of every ``set_capacity`` policy with keep and removal, the group cap passing a
capped waiter over, and the lock-delay that holds a revoked hold's permits back while a closed
session's return at once."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, List, Optional

import httpx
import pytest

import permit
import permit.aio
from conftest import Server, eventually, metric_sum, metrics
from permit._common import answer_failure

TAKE_ROUTE = 'route="/v1/semaphores/{name}/take"'


def run(main: Any) -> Any:
    return asyncio.run(asyncio.wait_for(main(), 60))


def test_a_take_without_a_rate_is_taken_at_once_and_holds_nothing(server: Server, name: str) -> None:
    with permit.Client(server.url) as client:
        client.set_capacity(name, 1)
        tokens = [client.take(name) for _ in range(20)]
        assert tokens == sorted(tokens) and len(set(tokens)) == 20, "tokens from the grant counter"
        assert client.take(name, timeout=5.0) > tokens[-1]
        info = client.semaphore(name)
        assert (info.held, info.available, info.holders, info.waiters, info.rate) == (0, 1, (), (), None)
        with pytest.raises(permit.NotFound) as missing:
            client.take(name + ".none")
        assert missing.value.code == "semaphore_not_found"


def test_a_rate_of_5_per_second_takes_its_burst_then_refuses_with_retry_after(server: Server, name: str) -> None:
    with permit.Client(server.url) as client:
        client.set_capacity(name, 100, rate=permit.Rate(5, per=1.0, burst=5))
        started = time.monotonic()
        tokens = [client.take(name) for _ in range(5)]
        assert tokens == sorted(tokens)
        # Past the burst the rate grants one per 200 ms: a few more may pass on a slow machine,
        # never more than the rate allows for the time spent.
        refused: Optional[permit.RateLimited] = None
        extra = 0
        for _ in range(100):
            try:
                client.take(name)
                extra += 1
            except permit.RateLimited as error:
                refused = error
                break
        elapsed = time.monotonic() - started
        assert refused is not None, "the rate never refused"
        assert extra <= 5 * elapsed + 1, (extra, elapsed)
        assert isinstance(refused, permit.LimitExceeded) and (refused.code, refused.status) == ("rate_limited", 429)
        assert refused.retry_after is not None and 0 < refused.retry_after <= 0.25, refused.retry_after
        rate = client.semaphore(name).rate
        assert rate is not None and (rate.permits, rate.per, rate.burst) == (5, 1.0, 5)
        assert (rate.available > 0 and rate.next_in == 0) or (rate.available == 0 and 0 < rate.next_in <= 0.2), rate
        # More than the burst can never be taken.
        with pytest.raises(permit.Conflict) as too_many:
            client.take(name, permits=6, timeout=1.0)
        assert too_many.value.code == "permits_exceed_capacity"


def test_a_waiting_take_is_queued_and_served_when_the_rate_allows(server: Server, name: str) -> None:
    with permit.Client(server.url) as client:
        client.set_capacity(name, 1, rate=permit.Rate(1, per=1.5))
        before_first = time.monotonic()
        first = client.take(name)
        got: List[int] = []
        failed: List[BaseException] = []

        def take() -> None:
            try:
                got.append(client.take(name, timeout=20.0))
            except BaseException as error:  # reported below
                failed.append(error)

        started = time.monotonic()
        taker = threading.Thread(target=take)
        taker.start()
        # It waits in the semaphore's queue as a take, not a session's acquire.
        assert eventually(lambda: [w.take for w in client.semaphore(name).waiters] == [True] or bool(got), 5.0)
        taker.join(20.0)
        assert not failed and got and got[0] > first, failed
        assert time.monotonic() - started < 10.0
        # One permit per 1.5 s: the second grant came no earlier than 1.5 s after the first
        # (a little leeway for the two clocks' rates).
        assert time.monotonic() - before_first >= 1.5 - 0.05
        assert client.semaphore(name).waiters == ()


def test_a_take_whose_wait_passes_is_rate_limited_and_leaves_no_waiter(server: Server, name: str) -> None:
    with permit.Client(server.url) as client:
        client.set_capacity(name, 1, rate=permit.Rate(1, per=60.0))
        client.take(name)
        started = time.monotonic()
        with pytest.raises(permit.RateLimited) as refused:
            client.take(name, timeout=0.3)
        assert time.monotonic() - started < 5.0
        assert refused.value.retry_after is not None and 50.0 < refused.value.retry_after <= 60.0
        assert client.semaphore(name).waiters == ()


def test_a_take_longer_than_one_request_asks_again_until_served(
    server: Server, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server waits at most 60 s per take; here the client's slice is 0.3 s, so that a wait
    # of a few seconds takes several requests.
    monkeypatch.setattr(permit._common, "TAKE_WAIT_MAX", 0.3)
    with permit.Client(server.url) as client:
        client.set_capacity(name, 1, rate=permit.Rate(1, per=1.5))
        first = client.take(name)
        before = metric_sum(metrics(server.url), "permit_http_requests_total", TAKE_ROUTE)
        assert client.take(name, timeout=10.0) > first
        asked = metric_sum(metrics(server.url), "permit_http_requests_total", TAKE_ROUTE) - before
        assert 2 <= asked <= 40, asked
        assert client.semaphore(name).waiters == ()

def test_set_capacity_round_trips_each_policy_and_keeps_or_removes_it(server: Server, name: str) -> None:
    with permit.Client(server.url) as client:
        info = client.set_capacity(name, 4)
        assert (info.rate, info.lock_delay, info.delayed, info.group_max, info.groups) == (None, 0.0, (), None, ())

        info = client.set_capacity(name, 4, rate=permit.Rate(10, per=2.0, burst=3))
        assert info.rate is not None and (info.rate.permits, info.rate.per, info.rate.burst) == (10, 2.0, 3)
        assert 0 <= info.rate.available <= 3

        info = client.set_capacity(name, 4, lock_delay=1.5)
        assert info.lock_delay == 1.5 and info.rate is not None and info.rate.permits == 10, "the rate is kept"

        info = client.set_capacity(name, 4, group_max=2)
        assert (info.group_max, info.lock_delay) == (2, 1.5) and info.rate is not None

        # Capacity alone keeps every policy; the read answers the same.
        info = client.set_capacity(name, 5)
        read = client.semaphore(name)
        for seen in (info, read):
            assert seen.capacity == 5 and (seen.lock_delay, seen.group_max) == (1.5, 2)
            assert seen.rate is not None and (seen.rate.permits, seen.rate.per, seen.rate.burst) == (10, 2.0, 3)

        # A rate without a burst gets a burst of its permits.
        info = client.set_capacity(name, 5, rate=permit.Rate(7, per=0.5))
        assert info.rate is not None and (info.rate.permits, info.rate.per, info.rate.burst) == (7, 0.5, 7)

        # None removes each one, leaving the others.
        info = client.set_capacity(name, 5, rate=None)
        assert (info.rate, info.lock_delay, info.group_max) == (None, 1.5, 2)
        info = client.set_capacity(name, 5, lock_delay=None)
        assert (info.rate, info.lock_delay, info.group_max) == (None, 0.0, 2)
        info = client.set_capacity(name, 5, group_max=None, lock_delay=0.25)
        assert (info.rate, info.lock_delay, info.group_max) == (None, 0.25, None)

        # Out of range: a typed refusal that changes nothing.
        for bad in ({"rate": permit.Rate(0)}, {"lock_delay": 61.0}, {"group_max": 0}, {"rate": permit.Rate(1, per=90_000.0)}):
            with pytest.raises(permit.InvalidRequest) as refused:
                client.set_capacity(name, 5, **bad)
            assert refused.value.code == "invalid_argument", bad
        with pytest.raises(ValueError):
            client.set_capacity(name, 5, rate=permit.Rate(1, per=0.0001))
        after = client.semaphore(name)
        assert (after.capacity, after.rate, after.lock_delay, after.group_max) == (5, None, 0.25, None)


def test_a_group_at_its_cap_is_passed_over_while_another_group_is_served(server: Server, name: str) -> None:
    with permit.Client(server.url) as client:
        client.set_capacity(name, 4, group_max=2)
        a1, a2, a3, b1 = (client.session(ttl=10.0) for _ in range(4))
        try:
            p1 = a1.acquire(name, group="team-a", timeout=5.0)
            a2.acquire(name, group="team-a", timeout=5.0)
            assert a3.try_acquire(name, group="team-a") is None, "team-a is at its cap"
            got: List[permit.Permit] = []
            waiter = threading.Thread(target=lambda: got.append(a3.acquire(name, group="team-a", timeout=20.0)))
            waiter.start()
            assert eventually(lambda: [(w.session, w.group) for w in client.semaphore(name).waiters] == [(a3.id, "team-a")])
            # team-b is served at once although team-a's waiter came first.
            pb = b1.acquire(name, group="team-b", timeout=5.0)
            info = client.semaphore(name)
            assert (info.held, info.available) == (3, 1) and not got
            assert {(h.session, h.group) for h in info.holders} == {(a1.id, "team-a"), (a2.id, "team-a"), (b1.id, "team-b")}
            assert info.groups == (permit.GroupInfo("team-a", 2, 2, 1), permit.GroupInfo("team-b", 1, 1, 0))
            # team-a drops below its cap: its waiter is granted.
            p1.release()
            waiter.join(20.0)
            assert got and got[0].token > pb.token
            assert [g.held for g in client.semaphore(name).groups] == [2, 1]
            with pytest.raises(permit.InvalidRequest):
                b1.acquire(name + ".bad", capacity=1, group="not a group!")
        finally:
            for session in (a1, a2, a3, b1):
                session.close()


def test_lock_delay_holds_back_a_revoked_hold_but_not_a_closed_session(server: Server, name: str) -> None:
    delay = 2.0
    with permit.Client(server.url) as client:
        client.set_capacity(name, 1, lock_delay=delay)
        # A clean end (closing the session releases): the permit is free at once.
        closing = client.session(ttl=10.0)
        closing.acquire(name, timeout=5.0)
        closing.close()
        info = client.semaphore(name)
        assert (info.held, info.available, info.delayed) == (0, 1, ())

        with client.session(ttl=10.0) as failed, client.session(ttl=10.0) as next_one:
            failed.acquire(name, timeout=5.0)
            revoked_at = time.monotonic()
            client._request("POST", f"/v1/semaphores/{name}/revoke", json={"session": failed.id})
            info = client.semaphore(name)
            assert (info.held, info.available, info.holders) == (0, 0, ())
            assert len(info.delayed) == 1 and info.delayed[0].permits == 1, info.delayed
            assert 0 < info.delayed[0].remaining <= delay
            assert next_one.try_acquire(name) is None, "the permit is in lock-delay"
            p = next_one.acquire(name, timeout=20.0)
            # The hold ended after the revoke was sent: its permit came back no earlier than
            # the delay after that (a little leeway for the two clocks' rates).
            assert time.monotonic() - revoked_at >= delay - 0.05
            assert client.semaphore(name).delayed == ()
            p.release()


def test_asyncio_take_set_capacity_and_groups(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            info = await client.set_capacity(name, 2, rate=permit.Rate(2, per=60.0), group_max=1, lock_delay=0.5)
            assert info.rate is not None and (info.rate.permits, info.rate.per, info.rate.burst) == (2, 60.0, 2)
            assert (info.group_max, info.lock_delay) == (1, 0.5)
            async with client.session() as a, client.session() as b:
                async with a.acquire(name, group="g1", timeout=5.0) as p:
                    assert (await client.semaphore(name)).holders[0].group == "g1"
                    assert await b.try_acquire(name, group="g1") is None, "g1 is at its cap"
                    # The acquire took one of the rate's two permits: one take left.
                    assert await client.take(name) > p.token
                with pytest.raises(permit.RateLimited) as refused:
                    await client.take(name)
                assert refused.value.retry_after is not None and refused.value.retry_after > 0
                with pytest.raises(permit.RateLimited):
                    await client.take(name, timeout=0.2)
            info = await client.set_capacity(name, 2, rate=None, group_max=None)
            assert (info.rate, info.group_max, info.lock_delay) == (None, None, 0.5)
            assert await client.take(name) > 0

    run(main)


def test_a_rate_limited_answer_carries_its_retry_after_in_ms() -> None:
    body = {"error": {"code": "rate_limited", "message": "no room", "retry_after_ms": 1250}}
    response = httpx.Response(429, json=body, headers={"retry-after": "2"})
    error = answer_failure("http://n1", response).error
    assert type(error) is permit.RateLimited and error.retry_after == 1.25 and error.status == 429
    # Without the body's field, the header's whole seconds.
    plain = httpx.Response(429, json={"error": {"code": "limit_exceeded", "message": "m"}}, headers={"retry-after": "3"})
    other = answer_failure("http://n1", plain).error
    assert type(other) is permit.LimitExceeded and other.retry_after == 3.0
