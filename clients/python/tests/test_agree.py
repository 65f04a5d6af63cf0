"""Issue 29 finding 6, "clients that agree": the environment variables of the CLI, ephemeral
semaphores made by ``capacity=``, leader and event watches, sessions closed on SIGTERM; each
against a real server."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import List, Optional

import pytest

import permit
import permit.aio
from conftest import Server, eventually, metric_sum, metrics

PYTHON_DIR = Path(__file__).resolve().parents[1]


def test_the_client_reads_the_cli_environment_and_explicit_arguments_win(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    with tempfile.TemporaryDirectory() as temp:
        data = Path(temp) / "data"
        node = Server(data, ["--auth"])
        try:
            assert eventually(lambda: (data / "root-token").exists())
            root = (data / "root-token").read_text().strip()
            dead = "http://127.0.0.1:9"
            monkeypatch.setenv("PERMIT_SERVER", f"{dead},{node.url}")
            monkeypatch.setenv("PERMIT_AUTH_TOKEN", root)
            with permit.Client() as client:
                assert client.endpoints == [dead, node.url]
                with client.session() as session, session.acquire(name, capacity=1) as p:
                    assert client.validate(name, p.token)
            # Explicit arguments win over the environment, each on its own.
            with permit.Client(node.url) as client:
                assert client.endpoints == [node.url]
                client.session().close()
            with permit.Client(auth_token="wrong") as client:
                with pytest.raises(permit.AuthError):
                    client.session()
            monkeypatch.setenv("PERMIT_AUTH_TOKEN", "")  # empty counts as unset, as for the CLI
            with permit.Client() as client:
                with pytest.raises(permit.AuthError) as refused:
                    client.session()
                assert refused.value.code == "unauthenticated"
            monkeypatch.delenv("PERMIT_SERVER")
            monkeypatch.delenv("PERMIT_AUTH_TOKEN")
            assert permit.Client().endpoints == ["http://127.0.0.1:7376"]
        finally:
            node.kill9()


def test_the_ca_file_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERMIT_CA_FILE", "/nonexistent/ca.pem")
    with pytest.raises(FileNotFoundError):
        permit.Client("https://127.0.0.1:1")
    with pytest.raises(FileNotFoundError):
        permit.aio.Client("https://127.0.0.1:1")
    monkeypatch.setenv("PERMIT_CLIENT_CERT", "/x.pem")
    with pytest.raises(ValueError, match="PERMIT_CLIENT_KEY"):
        permit.Client("https://127.0.0.1:1", ca_file=None)


def test_capacity_makes_an_ephemeral_semaphore_unless_kept(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session() as session:
        with session.acquire(name, capacity=2):
            assert client.semaphore(name).capacity == 2
        with pytest.raises(permit.NotFound):
            client.semaphore(name)
        held = session.try_acquire(name, capacity=1)
        assert held is not None
        held.release()
        with pytest.raises(permit.NotFound):
            client.semaphore(name)
        with session.acquire(name, capacity=3, ephemeral=False):
            pass
        assert client.semaphore(name).capacity == 3
        client.delete_semaphore(name)


def test_asyncio_capacity_makes_an_ephemeral_semaphore_unless_kept(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client, client.session() as session:
            async with session.acquire(name, capacity=2):
                assert (await client.semaphore(name)).capacity == 2
            with pytest.raises(permit.NotFound):
                await client.semaphore(name)
            async with session.acquire(name, capacity=3, ephemeral=False):
                pass
            assert (await client.semaphore(name)).capacity == 3
            await client.delete_semaphore(name)

    asyncio.run(main())


def test_observe_leader_yields_each_change_and_ends(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session() as a, client.session() as b:
        seen: List[permit.Leadership] = []
        with client.observe_leader(name, timeout=20.0) as leaders:
            first = next(leaders)
            assert first is None
            leadership = a.campaign(name, value="host-a")
            second = next(leaders)
            assert second is not None and (second.session, second.value) == (a.id, "host-a")
            # A second candidate moves the election's index but not its leader: nothing yielded.
            before = _candidates(server, name)
            queued = threading.Thread(target=lambda: seen.append(b.campaign(name, value="host-b", timeout=10.0)))
            queued.start()
            assert eventually(lambda: _candidates(server, name) > before)
            leadership.resign()
            third = next(leaders)
            assert third is not None and (third.session, third.value) == (b.id, "host-b")
            queued.join(10.0)
            seen[0].resign()  # type: ignore[union-attr]
        with pytest.raises(StopIteration):
            next(leaders)
    with permit.Client(server.url) as client:
        started = time.monotonic()
        assert list(client.observe_leader(name + ".none", timeout=0.5)) == [None]
        assert time.monotonic() - started < 5.0


def test_observe_leader_waits_on_the_server_and_does_not_poll(server: Server, name: str) -> None:
    def reads() -> float:
        return metric_sum(metrics(server.url), "permit_http_requests_total", 'route="/v1/elections/{name}"')

    before = reads()
    with permit.Client(server.url) as client:
        started = time.monotonic()
        assert list(client.observe_leader(name, timeout=2.0)) == [None]
        assert 2.0 <= time.monotonic() - started < 10.0
    # The first read, then one blocking read that the server holds until the watch's end (and
    # at most one more, should the server answer a hair before the deadline): no polling.
    assert 2 <= reads() - before <= 3


def _candidates(server: Server, name: str) -> int:
    import httpx

    return int(httpx.get(f"{server.url}/v1/elections/{name}", timeout=5.0).json()["candidates"])


def test_asyncio_observe_leader(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client, client.session() as a:
            async with client.observe_leader(name, timeout=20.0) as leaders:
                assert await leaders.__anext__() is None
                leadership = await a.campaign(name, value="v1")
                leader = await leaders.__anext__()
                assert leader is not None and (leader.session, leader.value) == (a.id, "v1")
                await leadership.resign()
                assert await leaders.__anext__() is None
            with pytest.raises(StopAsyncIteration):
                await leaders.__anext__()
            got = [leader async for leader in client.observe_leader(name, timeout=0.3)]
            assert got == [None]

    asyncio.run(main())


def test_events_stream_filters_by_prefix_and_ends(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session() as session:
        with client.events(prefix=name, kinds=["granted", "released"], timeout=20.0) as stream:
            # The stream shows new events only: open it before acquiring.
            events: List[permit.Event] = []

            def read() -> None:
                for event in stream:
                    events.append(event)
                    if len(events) == 2:
                        return

            reader = threading.Thread(target=read)
            reader.start()
            # Wait until the connection is open (it opens at the first next()).
            assert eventually(lambda: stream._response is not None)
            with session.acquire("other." + name, capacity=1):
                pass
            with session.acquire(name, capacity=1) as p:
                token = p.token
            reader.join(20.0)
            assert not reader.is_alive()
        assert [(e.kind, e.data["name"]) for e in events] == [("granted", name), ("released", name)]
        assert events[0].data["token"] == token and events[0].data["session"] == session.id
        assert events[0].id is not None and stream.last_id == events[1].id
        assert list(stream) == []  # closed
        # Resuming after the first event replays the second; the server ends it after timeout.
        started = time.monotonic()
        replay = list(client.events(prefix=name, after=events[0].id, timeout=1.0))
        assert [e.id for e in replay] == [events[1].id]
        assert time.monotonic() - started < 10.0
        with pytest.raises(permit.InvalidRequest):
            next(client.events(kinds=["no_such_kind"]))


def test_asyncio_events(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client, client.session() as session:
            async with client.events(prefix=name, kinds=["granted"], timeout=20.0) as stream:
                nxt = asyncio.ensure_future(stream.__anext__())
                assert await _eventually_async(lambda: stream._response is not None)
                async with session.acquire(name, capacity=1) as p:
                    event = await asyncio.wait_for(nxt, 20.0)
                assert (event.kind, event.data["name"], event.data["token"]) == ("granted", name, p._token)
            with pytest.raises(StopAsyncIteration):
                await stream.__anext__()

    asyncio.run(main())


async def _eventually_async(check: "object", timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        await asyncio.sleep(0.01)
    return bool(check())  # type: ignore[operator]


WORKER = """
import signal, sys, time
import permit
if sys.argv[2] == "app-handler":
    def app(signum, frame):
        print("app handler", flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, app)
if sys.argv[2] != "no-helper":
    permit.close_sessions_on_sigterm()
client = permit.Client()
with client.session(ttl=60.0) as session, session.acquire(sys.argv[1], capacity=1, ephemeral=False):
    print("held", flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.1)
"""


def _worker(server: Server, name: str, mode: str) -> "subprocess.Popen[str]":
    env = {**os.environ, "PERMIT_SERVER": server.url, "PYTHONPATH": str(PYTHON_DIR)}
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, name, mode], env=env, stdout=subprocess.PIPE, text=True
    )
    assert worker.stdout is not None
    assert worker.stdout.readline().strip() == "held"
    return worker


@pytest.mark.parametrize("mode", ["default", "app-handler"])
def test_a_worker_stopped_by_sigterm_frees_its_hold_at_once(server: Server, name: str, mode: str) -> None:
    with permit.Client(server.url) as client:
        worker = _worker(server, name, mode)
        try:
            assert len(client.semaphore(name).holders) == 1
            sent = time.monotonic()
            worker.send_signal(signal.SIGTERM)
            out, _ = worker.communicate(timeout=20.0)
            # Freed when the worker is gone, far before its 60 s TTL.
            assert client.semaphore(name).holders == ()
            assert time.monotonic() - sent < 10.0
            if mode == "default":
                assert worker.returncode == -signal.SIGTERM  # the default action still ran
            else:
                assert (worker.returncode, out.strip()) == (3, "app handler")  # chained
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait(10.0)
        client.delete_semaphore(name)


def test_without_the_helper_sigterm_leaves_the_hold_until_the_ttl(server: Server, name: str) -> None:
    with permit.Client(server.url) as client:
        worker = _worker(server, name, "no-helper")
        try:
            worker.send_signal(signal.SIGTERM)
            worker.communicate(timeout=20.0)
            assert len(client.semaphore(name).holders) == 1  # what the helper is for
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait(10.0)
        holder = client.semaphore(name).holders[0]
        client._request("DELETE", f"/v1/sessions/{holder.session}")
        client.delete_semaphore(name)


def test_proclaim_publishes_a_new_value_and_keeps_the_token(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session() as session:
        with client.observe_leader(name, timeout=20.0) as leaders:
            assert next(leaders) is None
            with session.campaign(name, value="host-a:1") as leadership:
                token = leadership.token
                assert next(leaders) == permit.Leader(session.id, "host-a:1", token)
                leadership.proclaim("host-a:2")
                assert (leadership.value, leadership.token) == ("host-a:2", token)
                # The watch sees the new value of the same leadership.
                assert next(leaders) == permit.Leader(session.id, "host-a:2", token)
                assert client.leader(name) == permit.Leader(session.id, "host-a:2", token)
                with pytest.raises(permit.InvalidRequest):
                    leadership.proclaim("v" * 4097)
                assert leadership.value == "host-a:2"
            with pytest.raises(permit.Conflict) as resigned:
                leadership.proclaim("host-a:3")
            assert resigned.value.code == "not_leader"
            assert next(leaders) is None


def test_proclaim_by_a_leader_that_was_revoked_is_refused(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session() as session:
        leadership = session.campaign(name, value="host-a")
        client._request("POST", f"/v1/elections/{name}/revoke", json={"session": session.id})
        with pytest.raises(permit.Conflict) as refused:
            leadership.proclaim("host-b")
        assert (refused.value.code, refused.value.status) == ("not_leader", 409)
        assert leadership.value == "host-a"
        assert client.leader(name) is None  # nothing was created
        assert not session.lost.is_set()  # the session lives on
        leadership.resign()


def test_asyncio_proclaim(server: Server, name: str) -> None:
    async def main() -> None:
        async with permit.aio.Client(server.url) as client, client.session() as session:
            async with client.observe_leader(name, timeout=20.0) as leaders:
                assert await leaders.__anext__() is None
                leadership = await session.campaign(name, value="v1")
                token = leadership.token
                assert await leaders.__anext__() == permit.Leader(session.id, "v1", token)
                await leadership.proclaim("v2")
                assert (leadership.value, leadership.token) == ("v2", token)
                assert await leaders.__anext__() == permit.Leader(session.id, "v2", token)
                await client._request("POST", f"/v1/elections/{name}/revoke", json={"session": session.id})
                with pytest.raises(permit.Conflict) as refused:
                    await leadership.proclaim("v3")
                assert refused.value.code == "not_leader" and leadership.value == "v2"
                await leadership.resign()

    asyncio.run(main())
