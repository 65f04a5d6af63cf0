"""A 3-node cluster: a leader kill -9 mid-hold keeps the permit and its token, and a claimed
item and a blocked claim."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import List

import httpx
import permit
import permit.aio
from conftest import Cluster, eventually, metric_sum, metrics


def test_leader_kill_keeps_the_permit_and_token(cluster: Cluster, name: str) -> None:
    leader = cluster.leader(5.0)
    assert leader is not None
    # The leader first, so that the client starts there and must move on after the kill.
    urls = cluster.urls()
    urls.insert(0, urls.pop(leader))
    with permit.Client(urls) as client, client.session(ttl=6.0) as session, client.session(ttl=6.0) as other:
        p = session.acquire(name, capacity=1, timeout=10.0)
        token = p.token
        # A waiter blocked on the leader across the kill: its long-poll fails over.
        granted: List[permit.Permit] = []
        waiter = threading.Thread(target=lambda: granted.append(other.acquire(name, timeout=30.0)))
        waiter.start()
        assert eventually(lambda: len(client.semaphore(name).waiters) == 1)
        killed = time.monotonic()
        cluster.nodes[leader].kill9()
        assert cluster.leader(15.0) not in (None, leader)
        # A keepalive sent after the kill is acknowledged by the new leader.
        assert eventually(lambda: session.deadline > killed + session.ttl, timeout=15.0)
        assert not p.lost.is_set() and p.token == token
        assert client.validate(name, token)
        assert [(h.session, h.token) for h in client.semaphore(name).holders] == [(session.id, token)]
        # The queue still works through the new leader: the waiter gets the next grant, with
        # a larger token.
        p.release()
        waiter.join(30)
        assert granted and granted[0].token > token and not granted[0].lost.is_set()
        granted[0].release()


def test_leader_kill_keeps_claims_and_a_blocked_claim_fails_over(cluster: Cluster, name: str) -> None:
    leader = cluster.leader(5.0)
    assert leader is not None
    urls = cluster.urls()
    urls.insert(0, urls.pop(leader))
    with permit.Client(urls) as client, client.session(ttl=6.0) as session, client.session(ttl=6.0) as other:
        client.push(name, "first")
        item = session.claim(name, timeout=10.0)
        token = item.token
        # A claim blocked on the leader across the kill: asked again (same request_id) on the
        # next node, it is the same claim, still waiting there.
        got: List[permit.Item] = []
        waiter = threading.Thread(target=lambda: got.append(other.claim(name, timeout=30.0)))
        waiter.start()
        assert eventually(lambda: client.queue(name).claimers == 1)
        killed = time.monotonic()
        cluster.nodes[leader].kill9()
        assert cluster.leader(15.0) not in (None, leader)
        assert eventually(lambda: session.deadline > killed + session.ttl, timeout=15.0)
        assert not item.lost.is_set() and item.token == token
        assert [(c.id, c.session, c.token) for c in client.items(name, state="claimed")] == [(item.id, session.id, token)]
        second = client.push(name, "second")
        waiter.join(30)
        assert got and (got[0].id, got[0].payload) == (second.id, "second") and got[0].token > token
        assert client.queue(name).claimed == 2, "the failed-over claim took one item"
        item.ack()
        got[0].ack()
        info = client.queue(name)
        assert (info.pending, info.claimed, info.claimers) == (0, 0, 0)


def test_leader_kill_keeps_the_permit_and_token_asyncio(cluster: Cluster, name: str) -> None:
    leader = cluster.leader(5.0)
    assert leader is not None
    urls = cluster.urls()
    urls.insert(0, urls.pop(leader))

    async def main() -> None:
        async with permit.aio.Client(urls) as client:
            async with client.session(ttl=6.0) as session:
                p = await session.acquire(name, capacity=1, timeout=10.0)
                token = p.token
                killed = time.monotonic()
                cluster.nodes[leader].kill9()
                deadline = time.monotonic() + 15.0
                while session.deadline <= killed + session.ttl and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                assert session.deadline > killed + session.ttl
                assert not p.lost.is_set() and p.token == token
                assert await client.validate(name, token)
                await p.release()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_the_client_sends_its_requests_to_the_leader_the_servers_name(cluster: Cluster, name: str) -> None:
    leader = cluster.leader(5.0)
    assert leader is not None
    urls = cluster.urls()
    follower = (leader + 1) % len(urls)
    # Every node names the leader in ``permit-leader``, on its own answers and forwarded ones.
    for url in urls:
        answer = httpx.get(url + "/v1/health", timeout=5.0, trust_env=False)
        assert answer.headers.get("permit-leader") == urls[leader]
    # A follower first: the first request goes there and is forwarded; its answer names the
    # leader, and the rest go to the leader directly.
    ordered = [urls[follower]] + [u for u in urls if u != urls[follower]]
    before = metric_sum(metrics(urls[follower]), "permit_forwarded_requests_total")
    with permit.Client(ordered) as client:
        with client.session(ttl=30.0) as session:
            for _ in range(3):
                session.acquire(name, capacity=1, timeout=10.0).release()
    assert metric_sum(metrics(urls[follower]), "permit_forwarded_requests_total") - before == 1

    async def main() -> None:
        async with permit.aio.Client(ordered) as client:
            async with client.session(ttl=30.0) as session:
                for _ in range(3):
                    await (await session.acquire(name, capacity=1, timeout=10.0)).release()

    before = metric_sum(metrics(urls[follower]), "permit_forwarded_requests_total")
    asyncio.run(main())
    assert metric_sum(metrics(urls[follower]), "permit_forwarded_requests_total") - before == 1
