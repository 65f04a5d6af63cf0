"""Processes: capacity across processes, and fork safety (gunicorn/celery prefork)."""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

import pytest

import permit
from conftest import Server

CTX = multiprocessing.get_context("fork")


def _worker(url: str, name: str, rounds: int, now: Any, high: Any, lock: Any) -> None:
    # A child opens its own client and session: nothing of the parent's is used.
    with permit.Client(url) as client, client.session(ttl=5.0) as session:
        for _ in range(rounds):
            with session.acquire(name, timeout=20.0):
                with lock:
                    now.value += 1
                    high.value = max(high.value, now.value)
                time.sleep(0.003)
                with lock:
                    now.value -= 1


def test_capacity_never_exceeded_by_processes(server: Server, name: str) -> None:
    with permit.Client(server.url) as client:
        client.set_capacity(name, 2)
    lock = CTX.Lock()
    now, high = CTX.Value("i", 0), CTX.Value("i", 0)
    procs = [CTX.Process(target=_worker, args=(server.url, name, 4, now, high, lock)) for _ in range(4)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    assert 1 <= high.value <= 2


def _child_uses_parent_session(session: permit.Session, p: permit.Permit, name: str, out: Any) -> None:
    results = []
    for call in (lambda: session.try_acquire(name + ".x"), p.release, session.close):
        try:
            call()
            results.append("ok")
        except permit.SessionForked as error:
            results.append(error.code)
    # Leaving the `with` block in a child does not close the parent's session either.
    session.__exit__(None, None, None)
    out.put(results)


def test_forked_child_cannot_use_the_parents_session(server: Server, name: str) -> None:
    with permit.Client(server.url) as client, client.session(ttl=5.0) as session:
        p = session.acquire(name, capacity=1)
        out = CTX.Queue()
        child = CTX.Process(target=_child_uses_parent_session, args=(session, p, name, out))
        child.start()
        try:
            assert out.get(timeout=20) == ["session_forked"] * 3
            child.join(20)
            assert child.exitcode == 0
        finally:
            if child.is_alive():
                child.kill()
                child.join(5)
        # The parent's session and hold are untouched.
        assert client.validate(name, p.token) and not session.lost.is_set()
        assert [h.session for h in client.semaphore(name).holders] == [session.id]


def test_fork_refusal_is_a_permit_error() -> None:
    from permit._common import check_pid

    with pytest.raises(permit.PermitError) as raised:
        check_pid(os.getpid() + 1, "abc")
    assert isinstance(raised.value, permit.SessionForked) and "fork" in raised.value.message


def _child_uses_parent_client(client: permit.Client, name: str, out: Any) -> None:
    # The parent's Client is fine in a child (it gets its own connection pool); a new session
    # opened here belongs to the child.
    with client.session() as session:
        p = session.try_acquire(name)
        out.put(p is not None and client.validate(name, p.token))
        if p is not None:
            p.release()


def test_forked_child_gets_its_own_connections(server: Server, name: str) -> None:
    with permit.Client(server.url) as client:
        client.set_capacity(name, 1)
        assert client.semaphore(name).capacity == 1  # the parent's pool is open now
        out = CTX.Queue()
        child = CTX.Process(target=_child_uses_parent_client, args=(client, name, out))
        child.start()
        try:
            assert out.get(timeout=20) is True
            child.join(20)
            assert child.exitcode == 0
        finally:
            if child.is_alive():
                child.kill()
                child.join(5)
        assert client.semaphore(name).holders == ()


def _child_uses_parent_async_session(session: Any, name: str, out: Any) -> None:
    import asyncio

    async def use() -> str:
        try:
            await session.try_acquire(name)
            return "ok"
        except permit.SessionForked as error:
            return error.code

    out.put(asyncio.run(use()))


def test_forked_child_cannot_use_the_parents_async_session(server: Server, name: str) -> None:
    import asyncio

    import permit.aio

    async def main() -> None:
        async with permit.aio.Client(server.url) as client:
            async with client.session() as session:
                p = await session.acquire(name, capacity=1)
                out = CTX.Queue()
                child = CTX.Process(target=_child_uses_parent_async_session, args=(session, name, out))
                child.start()
                try:
                    assert out.get(timeout=20) == "session_forked"
                    child.join(20)
                finally:
                    if child.is_alive():
                        child.kill()
                        child.join(5)
                assert await client.validate(name, p.token)

    asyncio.run(main())
