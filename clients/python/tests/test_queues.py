"""Work queues through the client, blocking and asyncio, against real servers: FIFO claims,
blocked claims answered by a push, ack/nack/claim_lost, the item as a context manager, items
of a lost session pending again, dead-lettering, and a retried claim that answers the same
claim instead of taking another."""

from __future__ import annotations

import asyncio
import http.server
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

import httpx
import pytest

import permit
import permit.aio
from conftest import Server, eventually, metric_sum, metrics

CLAIM_ROUTE = 'route="/v1/queues/{name}/claim"'
ACK_ROUTE = 'route="/v1/queues/{name}/items/{id}/ack"'


def run(main: Any) -> Any:
    return asyncio.run(asyncio.wait_for(main(), 60))


def test_items_are_claimed_in_order_and_an_ack_removes_them(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session(ttl=5.0) as session:
        pushed = client.push_many(name, [{"n": 1}, [2], None, permit.NewItem("later", delay=600.0)])
        assert [p.seq for p in pushed] == sorted(p.seq for p in pushed) and not any(p.duplicate for p in pushed)
        info = client.queue(name)
        assert (info.pending, info.delayed, info.claimed, info.dead_letter) == (3, 1, 0, f"{name}.dead")
        items = [session.claim(name, timeout=5.0) for _ in range(3)]
        assert [i.payload for i in items] == [{"n": 1}, [2], None]
        assert [i.id for i in items] == [p.id for p in pushed[:3]]
        assert [i.attempt for i in items] == [1, 1, 1]
        tokens = [i.token for i in items]
        assert tokens == sorted(tokens) and len(set(tokens)) == 3
        assert session.try_claim(name) is None, "the delayed item is not due"
        claimed = client.items(name, state="claimed")
        assert [(c.id, c.session, c.token) for c in claimed] == [(i.id, session.id, i.token) for i in items]
        for item in items:
            item.ack()
        info = client.queue(name)
        assert (info.pending, info.claimed, info.delayed) == (0, 0, 1)
        # Acked once: the client knows, and the server would say so too.
        with pytest.raises(permit.Conflict) as again:
            items[0].ack()
        assert again.value.code == "claim_lost"


def test_a_blocked_claim_is_answered_the_moment_an_item_is_pushed(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session(ttl=10.0) as session:
        client.put_queue(name)
        before = metric_sum(metrics(server.url), "permit_http_requests_total", CLAIM_ROUTE)
        got: List[permit.Item] = []
        waiter = threading.Thread(target=lambda: got.append(session.claim(name, timeout=20.0)))
        waiter.start()
        assert eventually(lambda: client.queue(name).claimers == 1)
        pushed_at = time.monotonic()
        pushed = client.push(name, {"job": 1})
        waiter.join(10.0)
        assert got and got[0].id == pushed.id and got[0].payload == {"job": 1}
        assert time.monotonic() - pushed_at < 3.0, "pushed by the server, not polled"
        # One long-poll, answered by the push: no polling in between.
        assert metric_sum(metrics(server.url), "permit_http_requests_total", CLAIM_ROUTE) - before == 1
        got[0].ack()


def test_a_claim_that_times_out_takes_nothing_and_leaves_no_claimer(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session() as session:
        client.put_queue(name)
        started = time.monotonic()
        with pytest.raises(permit.Timeout) as raised:
            session.claim(name, timeout=0.3)
        assert 0.25 <= time.monotonic() - started < 5.0 and raised.value.code == "wait_timeout"
        with pytest.raises(permit.Unavailable):
            session.claim(name, timeout=0)
        assert session.try_claim(name) is None
        assert session.claim_many(name, 5, timeout=0.2) == []
        assert client.queue(name).claimers == 0
        client.push(name, "one")
        assert (client.queue(name).pending, client.queue(name).claimed) == (1, 0), "nobody took it"
        with pytest.raises(permit.NotFound) as missing:
            session.claim(name + ".none", timeout=1.0)
        assert missing.value.code == "queue_not_found"


def test_the_item_acks_on_a_clean_exit_and_nacks_with_the_exception_text(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session() as session:
        client.push_many(name, ["good", "bad"])
        with session.claim(name, timeout=5.0) as item:
            assert item.payload == "good" and not item.lost.is_set()
        assert client.queue(name).pending == 1 and client.items(name) != [] and client.items(name)[0].payload == "bad"
        with pytest.raises(ValueError):
            with session.claim(name, timeout=5.0) as item:
                raise ValueError("bad input")
        (back,) = client.items(name)
        assert (back.id, back.state, back.attempt, back.last_error) == (item.id, "pending", 1, "ValueError: bad input")
        # Settled in the block: the exit adds nothing.
        with session.claim(name, timeout=5.0) as again:
            assert again.id == item.id and again.attempt == 2
            assert again.nack(delay=600.0, error="later") == "delayed"
        (later,) = client.items(name)
        assert (later.state, later.last_error, later.due_at_ms is not None) == ("delayed", "later", True)


def test_ack_and_nack_of_an_ended_claim_are_claim_lost(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session() as session:
        client.push(name, 1)
        item = session.claim(name, timeout=5.0)
        client.remove_item(name, item.id)
        with pytest.raises(permit.Conflict) as lost:
            item.ack()
        assert (lost.value.code, lost.value.status) == ("claim_lost", 409)
        with pytest.raises(permit.NotFound) as gone:
            client.remove_item(name, item.id)
        assert gone.value.code == "item_not_found"


def test_ack_and_claim_acks_and_claims_the_next_item_in_one_request(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session(ttl=10.0) as session:
        pushed = client.push_many(name, ["a", "b", "c"])
        before = metrics(server.url)
        item = session.claim(name, timeout=5.0)
        seen = []
        while item is not None:
            seen.append((item.id, item.payload))
            item = item.ack_and_claim(timeout=0)
        assert seen == [(p.id, payload) for p, payload in zip(pushed, ["a", "b", "c"])]
        info = client.queue(name)
        assert (info.pending, info.claimed, info.claimers) == (0, 0, 0)
        # One claim for the first item, then one request per item: each ack claimed the next.
        after = metrics(server.url)
        assert metric_sum(after, "permit_http_requests_total", CLAIM_ROUTE) - metric_sum(
            before, "permit_http_requests_total", CLAIM_ROUTE
        ) == 1
        assert metric_sum(after, "permit_http_requests_total", ACK_ROUTE) - metric_sum(
            before, "permit_http_requests_total", ACK_ROUTE
        ) == 3

        # A blocked one is answered by the next push; its ack stands meanwhile.
        client.push(name, "d")
        first = session.claim(name, timeout=5.0)
        got: List[Any] = []
        waiter = threading.Thread(target=lambda: got.append(first.ack_and_claim(timeout=20.0)))
        waiter.start()
        assert eventually(lambda: client.queue(name).claimers == 1)
        assert (client.queue(name).claimed, client.queue(name).pending) == (0, 0), "acked while the claim waits"
        later = client.push(name, "e")
        waiter.join(10.0)
        assert got and got[0] is not None and (got[0].id, got[0].payload) == (later.id, "e")
        # None came in time: None, and the ack stands.
        assert got[0].ack_and_claim(timeout=0.2) is None
        info = client.queue(name)
        assert (info.pending, info.claimed, info.claimers) == (0, 0, 0)
        with pytest.raises(permit.Conflict) as again:
            got[0].ack()
        assert again.value.code == "claim_lost"


def test_items_of_a_lost_session_are_lost_and_pending_again(server: Server, name: str) -> None:
    calls: List[permit.SessionLost] = []
    with permit.Client(server.url) as client:
        session = client.session(ttl=1.0)
        client.push_many(name, ["a", "b"])
        guarded = session.claim(name, timeout=5.0, on_lost=calls.append)
        plain = session.claim(name, timeout=5.0)
        assert client.queue(name).claimed == 2
        assert httpx.delete(f"{server.url}/v1/sessions/{session.id}", trust_env=False).status_code == 204
        assert guarded.lost.wait(2.0) and plain.lost.wait(2.0)
        assert len(calls) == 1 and isinstance(calls[0], permit.SessionLost)
        with pytest.raises(permit.SessionLost):
            guarded.token
        info = client.queue(name)
        assert (info.pending, info.claimed) == (2, 0), "pending again once the session ended"
        with client.session() as other:
            again = other.claim(name, timeout=5.0)
            assert (again.id, again.attempt) == (guarded.id, 2)
            assert again.token > guarded._token
            again.ack()
        assert client.items(name)[0].last_error == "the claiming session ended"
        with pytest.raises(permit.SessionLost):
            plain.ack()
        # A clean exit cannot ack a lost item: the work may be done again, and it says so.
        with pytest.raises(permit.SessionLost):
            with plain:
                pass
        session.close()


def test_an_item_nacked_max_attempts_times_is_dead_lettered(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session() as session:
        info = client.put_queue(name, max_attempts=2)
        assert (info.max_attempts, info.dead_letter) == (2, f"{name}.dead")
        client.push(name, {"job": 7})
        assert session.claim(name, timeout=5.0).nack(error="flaky") == "pending"
        last = session.claim(name, timeout=5.0)
        assert last.attempt == 2 and last.nack(error="bad input") == "dead"
        assert client.queue(name).pending == 0
        (dead,) = client.items(f"{name}.dead")
        assert (dead.id, dead.attempt, dead.payload, dead.last_error) == (last.id, 2, {"job": 7}, "bad input")
        assert client.queue(f"{name}.dead").dead_letter is None, "the end of the line"


def test_push_dedupes_by_key_and_queue_admin_errors_are_typed(server: Server, name: str) -> None:
    with permit.Client(server.url) as client:
        first = client.push(name, {"n": 1}, key="n1")
        assert client.push(name, {"n": 1}, key="n1") == permit.Pushed(first.id, first.seq, True)
        assert client.queue(name).pending == 1
        with pytest.raises(permit.InvalidRequest) as big:
            client.push(name, "x" * (64 * 1024))
        assert (big.value.code, big.value.status) == ("payload_too_large", 413)
        client.put_queue(name + ".small", max_items=1)
        client.push(name + ".small", 1)
        with pytest.raises(permit.Conflict) as full:
            client.push(name + ".small", 2)
        assert full.value.code == "queue_full"
        with pytest.raises(permit.Conflict) as busy:
            client.delete_queue(name)
        assert busy.value.code == "queue_busy"
        with pytest.raises(permit.NotFound) as missing:
            client.queue(name + ".none")
        assert missing.value.code == "queue_not_found"
        names = [q.name for q in client.queues()]
        assert name in names and name + ".small" in names
        client.put_queue(name + ".empty")
        client.delete_queue(name + ".empty")
        assert name + ".empty" not in [q.name for q in client.queues()]
        with pytest.raises(ValueError):
            client.push_many(name, range(1001))


def test_a_blocked_claim_rides_out_an_outage_shorter_than_the_session() -> None:
    """As a blocked acquire: a claim survives the server being down for longer than the
    request's own retries (about 6 s) but shorter than the session, and is then the same claim
    (its request_id) on the server; an outage longer than the session ends it with SessionLost."""
    with tempfile.TemporaryDirectory(prefix="permit-py-queue-outage-") as temp:
        node = Server(Path(temp) / "data", [])
        try:
            with permit.Client(node.url) as client:
                client.put_queue("outage")
                waiter = client.session(ttl=30.0)
                short = client.session(ttl=2.0)
                outcome: List[object] = []

                def wait(session: permit.Session) -> None:
                    try:
                        outcome.append(session.claim("outage", timeout=60))
                    except permit.PermitError as error:
                        outcome.append(error)

                threads = [threading.Thread(target=wait, args=(s,), daemon=True) for s in (waiter, short)]
                for thread in threads:
                    thread.start()
                assert eventually(lambda: client.queue("outage").claimers == 2)
                node.kill9()
                time.sleep(7.5)  # the outage itself, longer than the retries of one request
                assert threads[0].is_alive(), outcome
                node = Server(Path(temp) / "data", [], listen=node.addr)
                threads[1].join(10)
                assert len(outcome) == 1 and isinstance(outcome[0], permit.SessionLost), outcome
                pushed = client.push("outage", "after the outage")
                threads[0].join(20)
                assert len(outcome) == 2 and isinstance(outcome[1], permit.Item), outcome
                assert (outcome[1].id, outcome[1].session) == (pushed.id, waiter)
                assert client.queue("outage").claimed == 1
                outcome[1].ack()
                waiter.close()
        finally:
            node.kill9()


class LossyProxy:
    """An HTTP proxy in front of a server: forwards every request, but the answer of the first
    claim is lost after the server applied it: the connection closes without an answer
    (``drop``) or the proxy answers 503 ``no_leader`` (``503``). What the client sends is
    recorded."""

    def __init__(self, upstream: str, mode: str) -> None:
        self.claims: List[Dict[str, Any]] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def forward(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {"content-type": self.headers.get("content-type", "application/json")}
                with httpx.Client(trust_env=False, timeout=70.0) as http:
                    answer = http.request(self.command, upstream + self.path, content=body, headers=headers)
                if self.path.endswith("/claim"):
                    proxy.claims.append(httpx.Response(200, content=body or b"{}").json())
                    if len(proxy.claims) == 1:
                        if mode == "drop":
                            self.close_connection = True
                            return
                        answer = httpx.Response(503, json={"error": {"code": "no_leader", "message": "lost"}})
                self.send_response(answer.status_code)
                for key in ("content-type", "permit-index"):
                    if key in answer.headers:
                        self.send_header(key, answer.headers[key])
                self.send_header("content-length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_PUT = do_DELETE = forward

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10.0)


@pytest.mark.parametrize("mode", ["drop", "503"])
def test_a_retried_claim_answers_the_item_it_took_instead_of_taking_another(server: Server, name: str, mode: str) -> None:
    proxy = LossyProxy(server.url, mode)
    try:
        with permit.Client(server.url) as direct, permit.Client(proxy.url) as client, client.session() as session:
            pushed = direct.push_many(name, ["first", "second"])
            item = session.claim(name, timeout=10.0)
            assert (item.id, item.payload) == (pushed[0].id, "first")
            info = direct.queue(name)
            assert (info.claimed, info.pending) == (1, 1), "the retry took nothing more"
            assert len(proxy.claims) == 2 and proxy.claims[0] == proxy.claims[1], "the same claim sent again"
            assert 0 < proxy.claims[0]["request_id"] < 2**53
            item.ack()
            assert direct.queue(name).claimed == 0
    finally:
        proxy.close()


def test_asyncio_claims_guard_and_push(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            async with client.session(ttl=5.0) as session:
                pushed = await client.push_many(name, ["a", "b", "c"])
                async with session.claim(name, timeout=5.0) as item:
                    assert (item.id, item.payload, item.attempt) == (pushed[0].id, "a", 1)
                with pytest.raises(KeyError):
                    async with session.claim(name, timeout=5.0) as item:
                        raise KeyError("b")
                back = await client.items(name, state="pending")
                assert [(b.id, b.last_error) for b in back] == [(pushed[1].id, "KeyError: 'b'"), (pushed[2].id, None)]
                got = await session.claim_many(name, 5, timeout=5.0)
                assert [g.payload for g in got] == ["b", "c"] and got[0].attempt == 2
                assert await got[0].nack() == "pending"
                await got[1].ack()
                again = await session.claim(name)
                assert again.id == pushed[1].id and again.attempt == 3
                await again.ack()
                assert await session.try_claim(name) is None
                with pytest.raises(permit.Timeout):
                    await session.claim(name, timeout=0.2)

                waiter = asyncio.create_task(session.claim(name, timeout=20.0))
                assert await until(lambda: claimers(client, name, 1))
                late = await client.push(name, "late")
                item = await asyncio.wait_for(waiter, 5.0)
                assert item.id == late.id
                await item.ack()
                info = await client.queue(name)
                assert (info.pending, info.claimed, info.claimers) == (0, 0, 0)

    run(main)


def test_asyncio_items_of_a_lost_session_are_lost_and_pending_again(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            lost: List[permit.SessionLost] = []
            session = await client.session(ttl=1.0)
            await client.push(name, "job")
            item = await session.claim(name, timeout=5.0, on_lost=lost.append)
            async with httpx.AsyncClient(trust_env=False) as http:
                assert (await http.delete(f"{server.url}/v1/sessions/{session.id}")).status_code == 204
            await asyncio.wait_for(item.lost.wait(), 2.0)
            assert len(lost) == 1
            with pytest.raises(permit.SessionLost):
                await item.ack()
            async with client.session() as other:
                async with other.claim(name, timeout=5.0) as again:
                    assert (again.id, again.attempt) == (item.id, 2)
            assert (await client.queue(name)).pending == 0
            await session.close()

    run(main)


def test_asyncio_cancelling_a_blocked_claim_leaves_no_claimer_and_takes_nothing(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            async with client.session() as session:
                await client.put_queue(name)
                task = asyncio.create_task(session.claim(name, timeout=30.0))
                assert await until(lambda: claimers(client, name, 1))
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                # Ended before the cancellation reached the caller: a push now stays pending.
                assert (await client.queue(name)).claimers == 0
                await client.push(name, "for someone else")
                info = await client.queue(name)
                assert (info.pending, info.claimed) == (1, 0)

    run(main)


def test_asyncio_cancelling_an_ack_and_claim_keeps_the_ack_and_takes_nothing(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            async with client.session() as session:
                await client.push(name, "one")
                item = await session.claim(name, timeout=5.0)
                task = asyncio.create_task(item.ack_and_claim(timeout=30.0))
                assert await until(lambda: claimers(client, name, 1))
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                # The ack stands and the claim's wait ended: a push now stays pending.
                info = await client.queue(name)
                assert (info.claimers, info.pending, info.claimed) == (0, 0, 0)
                await client.push(name, "for someone else")
                info = await client.queue(name)
                assert (info.pending, info.claimed) == (1, 0)
                nxt = await session.claim(name, timeout=5.0)
                assert nxt.payload == "for someone else"
                assert await nxt.ack_and_claim(timeout=0) is None

    run(main)


@pytest.mark.parametrize("mode", ["drop", "503"])
def test_asyncio_a_retried_claim_answers_the_item_it_took(server: Server, name: str, mode: str) -> None:
    proxy = LossyProxy(server.url, mode)

    async def main() -> None:
        async with permit.aio.Client(server.url) as direct, permit.aio.Client(proxy.url) as client:
            async with client.session() as session:
                pushed = await direct.push_many(name, ["first", "second"])
                async with session.claim(name, timeout=10.0) as item:
                    assert item.id == pushed[0].id
                    info = await direct.queue(name)
                    assert (info.claimed, info.pending) == (1, 1)
                assert len(proxy.claims) == 2 and proxy.claims[0] == proxy.claims[1]

    try:
        run(main)
    finally:
        proxy.close()


async def claimers(client: permit.aio.Client, name: str, count: int) -> bool:
    try:
        return (await client.queue(name)).claimers == count
    except permit.NotFound:
        return False


async def until(check: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.01)
    return bool(await check())
