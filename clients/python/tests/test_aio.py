"""The asyncio client passes the same tests as the blocking one."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, List, TypeVar

import httpx
import pytest

import permit
import permit.aio
from conftest import KeepaliveCounts, Server, batch_route_refused, metric_sum, metrics, own_server, unavailable

T = TypeVar("T")


def run(main: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(asyncio.wait_for(main(), 60))  # type: ignore[arg-type]


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.01)
    return await check()


def test_acquire_holds_and_release_frees(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            async with client.session(ttl=5.0) as session:
                async with session.acquire(name, permits=2, capacity=8, ephemeral=False) as p:
                    assert p.permits == 2 and p.token > 0 and not p.lost.is_set()
                    info = await client.semaphore(name)
                    assert [(h.session, h.permits, h.token) for h in info.holders] == [(session.id, 2, p.token)]
                    assert await client.validate(name, p.token)
                assert (await client.semaphore(name)).holders == ()

    run(main)


def test_try_acquire_and_tokens_grow(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            a, b = await client.session(), await client.session()
            first = await a.try_acquire(name, capacity=1, ephemeral=False)
            assert first is not None
            assert await b.try_acquire(name) is None
            await first.release()
            second = await b.try_acquire(name)
            assert second is not None and second.token > first._token
            await a.close()
            await b.close()

    run(main)


def test_capacity_never_exceeded_by_tasks(server: Server, name: str) -> None:
    capacity, workers, rounds = 3, 8, 4
    state = {"now": 0, "max": 0, "grants": 0}

    async def worker(client: permit.aio.Client, i: int) -> None:
        async with client.session() as session:
            for r in range(rounds):
                weight = 1 + (i + r) % 2
                async with session.acquire(name, permits=weight, timeout=20.0):
                    state["now"] += weight
                    state["max"] = max(state["max"], state["now"])
                    state["grants"] += 1
                    await asyncio.sleep(0.002)
                    state["now"] -= weight

    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            await client.set_capacity(name, capacity)
            await asyncio.gather(*(worker(client, i) for i in range(workers)))

    run(main)
    assert state["grants"] == workers * rounds and 1 <= state["max"] <= capacity


def test_strict_fifo_order(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            holder = await client.session()
            first = await holder.acquire(name, capacity=1)
            sessions = [await client.session() for _ in range(4)]
            order: List[str] = []

            async def wait(s: permit.aio.Session) -> None:
                async with s.acquire(name, timeout=20.0):
                    order.append(s.id)

            tasks = []
            for i, s in enumerate(sessions):
                tasks.append(asyncio.ensure_future(wait(s)))

                async def queued(n: int = i + 1) -> bool:
                    return len((await client.semaphore(name)).waiters) == n

                assert await until(queued)
            await first.release()
            await asyncio.gather(*tasks)
            assert order == [s.id for s in sessions]
            for s in sessions + [holder]:
                await s.close()

    run(main)


def test_blocking_acquire_is_pushed_not_polled(server: Server, name: str) -> None:
    route = 'route="/v1/semaphores/{name}/acquire"'

    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            holder = await client.session()
            first = await holder.acquire(name, capacity=1)
            before = metrics(server.url)
            sessions = [await client.session() for _ in range(3)]

            async def wait(s: permit.aio.Session) -> None:
                async with s.acquire(name, timeout=30.0):
                    pass

            tasks = [asyncio.ensure_future(wait(s)) for s in sessions]

            async def queued() -> bool:
                return len((await client.semaphore(name)).waiters) == 3

            assert await until(queued)
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                now = metrics(server.url)
                done = metric_sum(now, "permit_http_requests_total", route) - metric_sum(
                    before, "permit_http_requests_total", route
                )
                assert done == 0 and now["permit_waiters"] >= 3 and now["permit_connections_open"] >= 3
                await asyncio.sleep(0.1)
            await first.release()
            await asyncio.gather(*tasks)
            after = metrics(server.url)
            assert metric_sum(after, "permit_http_requests_total", route, 'status="200"') - metric_sum(
                before, "permit_http_requests_total", route, 'status="200"'
            ) == 3
            for s in sessions + [holder]:
                await s.close()

    run(main)


def test_timeout_gives_the_place_up(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            a, b = await client.session(), await client.session()
            await a.acquire(name, capacity=1)
            with pytest.raises(permit.Timeout):
                await b.acquire(name, timeout=0.3)
            assert (await client.semaphore(name)).waiters == ()
            await a.close()
            await b.close()

    run(main)


def test_session_deleted_server_side_sets_lost_within_ttl(server: Server, name: str) -> None:
    calls: List[Any] = []

    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            session = await client.session(ttl=1.0, on_lost=calls.append)
            p = await session.acquire(name, capacity=1)
            deleted = time.monotonic()
            async with httpx.AsyncClient(trust_env=False) as raw:
                assert (await raw.delete(f"{server.url}/v1/sessions/{session.id}")).status_code == 204
            await asyncio.wait_for(p.lost.wait(), 2.0)
            assert time.monotonic() - deleted <= 1.2
            with pytest.raises(permit.SessionLost):
                p.token
            await p.release()
            await session.close()

    run(main)
    assert len(calls) == 1


def test_waiter_is_told_when_its_session_is_lost(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            a, b = await client.session(), await client.session(ttl=1.0)
            await a.acquire(name, capacity=1)
            waiting = asyncio.ensure_future(b.acquire(name, timeout=20.0))

            async def queued() -> bool:
                return len((await client.semaphore(name)).waiters) == 1

            assert await until(queued)
            async with httpx.AsyncClient(trust_env=False) as raw:
                await raw.delete(f"{server.url}/v1/sessions/{b.id}")
            with pytest.raises(permit.SessionLost):
                await asyncio.wait_for(waiting, 5.0)
            await a.close()

    run(main)


def test_exception_in_body_still_releases(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            async with await client.session() as session:
                with pytest.raises(ZeroDivisionError):
                    async with await session.acquire(name, capacity=1, ephemeral=False):
                        1 / 0
                assert (await client.semaphore(name)).holders == ()

    run(main)


def test_session_acquire_and_campaign_are_awaitable_and_async_context_managers(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            async with client.session() as session:
                assert isinstance(session, permit.aio.Session) and session.state == "alive"
                async with session.acquire(name, capacity=1, ephemeral=False) as p:
                    assert isinstance(p, permit.aio.Permit) and await client.validate(name, p.token)
                assert (await client.semaphore(name)).holders == ()
                async with session.campaign(name + ".e", value="a") as leading:
                    assert isinstance(leading, permit.aio.Leadership)
                    assert await client.leader(name + ".e") == (session.id, "a", leading.token)
                assert await client.leader(name + ".e") is None
                # Awaited, each gives the object itself, to close or release by hand.
                held = await session.acquire(name)
                assert [h.token for h in (await client.semaphore(name)).holders] == [held.token]
                await held.release()
                # A coroutine: tasks take it as they took the coroutine functions before.
                task = asyncio.create_task(session.acquire(name))
                async with await task as again:
                    assert again.token > held.token
            assert session.state == "closed"
            other = await client.session()
            assert other.state == "alive"
            await other.close()

    run(main)


def test_an_exception_in_async_with_releases_the_hold_and_closes_the_session(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            entered: List[permit.aio.Session] = []
            with pytest.raises(ZeroDivisionError):
                async with client.session() as session:
                    entered.append(session)
                    async with session.campaign(name + ".e"):
                        async with session.acquire(name, capacity=1, ephemeral=False):
                            1 / 0
            (session,) = entered
            assert session.state == "closed"
            assert (await client.semaphore(name)).holders == ()
            assert await client.leader(name + ".e") is None
            with pytest.raises(permit.SessionLost) as gone:
                await client._request("GET", f"/v1/sessions/{session.id}")
            assert gone.value.code == "session_not_found"
            # The hold alone: released, the session lives on.
            async with client.session() as other:
                with pytest.raises(ZeroDivisionError):
                    async with other.acquire(name):
                        1 / 0
                assert (await client.semaphore(name)).holders == ()
                assert other.state == "alive"
                async with other.acquire(name) as p:
                    assert p.permits == 1

    run(main)


def test_cancelling_a_task_blocked_in_async_with_acquire_gives_the_place_up(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            async with client.session() as holder, client.session() as waiter:
                entered: List[int] = []

                async def wait() -> None:
                    async with waiter.acquire(name, timeout=30.0) as p:
                        entered.append(p.token)

                async with holder.acquire(name, capacity=1, ephemeral=False):
                    task = asyncio.create_task(wait())
                    assert await until(async_waiters(client, name, 1))
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await task
                    # Given up before the cancellation reached the caller.
                    assert (await client.semaphore(name)).waiters == ()
                assert entered == [] and waiter.state == "alive"
                assert (await client.semaphore(name)).holders == ()
                # The name is no longer claimed by the cancelled wait.
                async with waiter.acquire(name, timeout=10.0) as p:
                    assert [h.session for h in (await client.semaphore(name)).holders] == [waiter.id]

    run(main)


def test_campaign_leads_and_resign_hands_over(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            a, b = await client.session(), await client.session()
            assert await client.leader(name) is None
            leading = await a.campaign(name, value="host-a")
            assert await client.leader(name) == (a.id, "host-a", leading.token)
            with pytest.raises(permit.Timeout):
                await b.campaign(name, value="host-b", timeout=0.2)
            follower = asyncio.ensure_future(b.campaign(name, value="host-b", timeout=20.0))
            await asyncio.sleep(0)
            await leading.resign()
            second = await asyncio.wait_for(follower, 10.0)
            assert second.token > leading.token
            assert await client.leader(name) == (b.id, "host-b", second.token)
            await a.close()
            await b.close()

    run(main)


def test_errors_are_typed(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            with pytest.raises(permit.NotFound) as missing:
                await client.semaphore(name)
            assert (missing.value.code, missing.value.status) == ("semaphore_not_found", 404)
            with pytest.raises(permit.InvalidRequest):
                await client.set_capacity("bad name!", 1)
            async with client.session() as session:
                await client.set_capacity(name, 2)
                with pytest.raises(permit.Conflict) as too_many:
                    await session.acquire(name, permits=3)
                assert too_many.value.code == "permits_exceed_capacity"

    run(main)


def test_unreachable_server_is_presumed_lost_at_the_local_deadline(name: str) -> None:
    import os
    import signal
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as temp:
        node = Server(Path(temp) / "data", [])
        try:

            async def main() -> None:
                client = permit.aio.Client(node.url)
                calls: List[Any] = []
                session = await client.session(ttl=0.9, on_lost=calls.append)
                p = await session.acquire(name, capacity=1)
                os.kill(node.proc.pid, signal.SIGSTOP)
                try:
                    stopped = time.monotonic()
                    await asyncio.wait_for(p.lost.wait(), 2.0)
                    assert time.monotonic() - stopped <= 0.9 + 0.3
                    assert session.state == "lost" and len(calls) == 1
                finally:
                    os.kill(node.proc.pid, signal.SIGCONT)
                await client.close()

            run(main)
        finally:
            node.kill9()


def test_keepalive_outlives_the_ttl_and_max_hold_is_lost(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            async with client.session(ttl=0.6) as session:
                p = await session.acquire(name, capacity=2)
                start = time.monotonic()

                async def renewed() -> bool:
                    return session.deadline > start + 3 * 0.6

                assert await until(renewed, 5.0)
                assert not p.lost.is_set() and await client.validate(name, p.token)
                bounded = await session.acquire(name + ".b", capacity=1, max_hold=0.3)
                await asyncio.wait_for(bounded.lost.wait(), 2.0)
                assert not session.lost.is_set() and not p.lost.is_set()
                with pytest.raises(permit.SessionLost) as raised:
                    bounded.token
                assert raised.value.code == "hold_expired"

    run(main)


def test_try_campaign_and_closed_session(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            a, b = await client.session(), await client.session()
            async with a.campaign(name, value="a") as leading:
                with pytest.raises(permit.Unavailable):
                    await b.campaign(name, value="b", timeout=0)
                assert await client.leader(name) == (a.id, "a", leading.token)
            assert await client.leader(name) is None
            await b.close()
            assert b.state == "closed"
            with pytest.raises(permit.SessionLost) as raised:
                await b.try_acquire(name, capacity=1)
            assert raised.value.code == "session_closed"
            await a.close()

    run(main)


def test_keepalive_many_renews_each_session_and_reports_the_unknown_alone(server: Server) -> None:
    a = httpx.post(server.url + "/v1/sessions", json={"ttl_ms": 60000}).json()["id"]
    unknown = "0" * 32

    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            results = await client.keepalive_many([unknown, a])
            assert list(results) == [unknown, a] and results[a] == 60.0
            error = results[unknown]
            assert isinstance(error, permit.SessionLost) and error.code == "session_not_found"
            with pytest.raises(permit.InvalidRequest):
                await client.keepalive_many([a, a])

    run(main)
    httpx.delete(f"{server.url}/v1/sessions/{a}")


SESSIONS = 6
TTL = 0.9


def test_background_keepalives_of_one_client_share_requests(name: str) -> None:
    with tempfile.TemporaryDirectory() as temp:
        node = own_server(temp)
        try:

            async def main() -> None:
                async with permit.aio.Client(node.url) as client:
                    sessions = [await client.session(ttl=TTL) for _ in range(SESSIONS)]
                    holds = [await s.acquire(name, capacity=SESSIONS) for s in sessions]
                    start = time.monotonic()

                    async def renewed() -> bool:
                        return all(s.deadline > start + 3 * TTL for s in sessions)

                    # Several TTLs of acknowledged keepalives, each pushing every deadline on.
                    assert await until(renewed, timeout=15.0)
                    assert [s.state for s in sessions] == ["alive"] * SESSIONS
                    assert not any(h.lost.is_set() for h in holds)
                    for h in holds:
                        assert await client.validate(name, h.token)
                    seen = KeepaliveCounts(node.url)
                    assert seen.renewals >= 2 * SESSIONS, seen
                    assert seen.batched > 0 and seen.single == 0, seen
                    assert 2 * seen.requests <= seen.renewals, seen
                    # A session the server no longer knows is lost alone; its batch-mates live on.
                    gone, rest = sessions[0], sessions[1:]
                    async with httpx.AsyncClient(trust_env=False) as http:
                        assert (await http.delete(f"{node.url}/v1/sessions/{gone.id}")).status_code == 204
                    await asyncio.wait_for(holds[0].lost.wait(), 3 * TTL)
                    assert gone.state == "lost"
                    later = time.monotonic()

                    async def renewed_rest() -> bool:
                        return all(s.deadline > later + TTL for s in rest)

                    assert await until(renewed_rest, timeout=10.0)
                    assert [s.state for s in rest] == ["alive"] * (SESSIONS - 1)
                    assert not any(h.lost.is_set() for h in holds[1:])
                    for s in sessions:
                        await s.close()

            run(main)
        finally:
            node.kill9()


def test_background_keepalives_fall_back_to_one_per_session_on_an_older_server(name: str) -> None:
    with tempfile.TemporaryDirectory() as temp:
        node = own_server(temp, {"PERMIT_INJECT_BUG": "no_keepalive_batch"})
        try:
            if not batch_route_refused(node.url):
                unavailable("this permit binary has no bug injection (a test build has it)")

            async def main() -> None:
                async with permit.aio.Client(node.url) as client:
                    sessions = [await client.session(ttl=TTL) for _ in range(3)]
                    start = time.monotonic()

                    async def renewed() -> bool:
                        return all(s.deadline > start + 3 * TTL for s in sessions)

                    assert await until(renewed, timeout=15.0)
                    assert [s.state for s in sessions] == ["alive"] * 3
                    seen = KeepaliveCounts(node.url)
                    assert seen.batch_refused == 2 and seen.batched == 0, seen
                    assert seen.single >= 2 * 3 and seen.renewals == seen.single, seen
                    for s in sessions:
                        await s.close()

            run(main)
        finally:
            node.kill9()


def test_a_second_acquire_of_a_held_name_fails_and_never_frees_the_outer_hold(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            async with client.session() as session, client.session() as other:
                async with session.acquire(name, capacity=1, ephemeral=False) as outer:
                    with pytest.raises(permit.AlreadyHeld):
                        await session.acquire(name)
                    with pytest.raises(permit.AlreadyHeld):
                        await session.try_acquire(name)
                    with pytest.raises(permit.AlreadyHeld):
                        async with session.acquire(name):
                            pass
                    with pytest.raises(permit.AlreadyHeld):
                        async with session.campaign(name + ".e"), session.campaign(name + ".e"):
                            pass
                    outer.check()
                    assert await other.try_acquire(name) is None, "the outer hold is intact"
                    # An acquire in flight claims its name too.
                    waiting = asyncio.ensure_future(other.acquire(name, timeout=10.0))
                    assert await until(async_waiters(client, name, 1))
                    with pytest.raises(permit.AlreadyHeld):
                        await other.try_acquire(name)
                async with await waiting as taken:
                    assert taken.token > outer._token
                async with session.acquire(name) as again:
                    assert again.token > taken._token

    run(main)


def async_waiters(client: "permit.aio.Client", name: str, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return len((await client.semaphore(name)).waiters) == count

    return check


def test_a_blocked_acquire_rides_out_an_outage_shorter_than_the_session() -> None:
    """Issue 29, finding 2, asyncio: as the sync client's test of the same name."""
    with tempfile.TemporaryDirectory(prefix="permit-py-outage-") as temp:
        data = Path(temp) / "data"
        node = Server(data, [])

        async def main() -> None:
            nonlocal node
            async with permit.aio.Client(node.url) as client:
                holder = await client.session(ttl=30.0)
                held = await holder.acquire("outage", capacity=1)
                waiter = await client.session(ttl=30.0)
                short = await client.session(ttl=2.0)
                long_wait = asyncio.ensure_future(waiter.acquire("outage", timeout=60))
                short_wait = asyncio.ensure_future(short.acquire("outage", timeout=60))
                assert await until(lambda: waiting(client, 2))
                node.kill9()
                await asyncio.sleep(7.5)  # the outage itself, longer than the retries of one request
                assert not long_wait.done()
                node = Server(data, [], listen=node.addr)
                with pytest.raises(permit.SessionLost):
                    await asyncio.wait_for(short_wait, 10)
                await held.release()
                granted = await asyncio.wait_for(long_wait, 20)
                assert granted.session is waiter
                await granted.release()
                await holder.close()
                await waiter.close()

        try:
            run(main)
        finally:
            node.kill9()


async def waiting(client: permit.aio.Client, count: int) -> bool:
    return len((await client.semaphore("outage")).waiters) == count
