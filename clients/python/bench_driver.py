"""Benchmark driver for the Python client, run by ``permit-bench`` (part ``python``).

W1: one session, capacity 4, loop {try-acquire 1; release}. W2: ``--clients`` sessions (one
per thread or asyncio task), capacity 4, loop {blocking acquire; release}. Prints one JSON
line of figures in milliseconds.

Example::

    python bench_driver.py --url http://127.0.0.1:7376 --workload w1 --mode threads --duration 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from typing import Any, Dict, List

import permit
import permit.aio


def quantile(values: List[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def w1_threads(url: str, name: str, duration: float) -> Dict[str, Any]:
    acquire: List[float] = []
    release: List[float] = []
    with permit.Client(url) as client, client.session(ttl=60.0) as session:
        client.set_capacity(name, 4)
        started = time.perf_counter()
        while time.perf_counter() - started < duration:
            t = time.perf_counter()
            p = session.try_acquire(name)
            acquire.append(time.perf_counter() - t)
            assert p is not None, "uncontended acquire refused"
            t = time.perf_counter()
            p.release()
            release.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - started
    return summary(len(acquire) / elapsed, acquire, release)


async def w1_asyncio(url: str, name: str, duration: float) -> Dict[str, Any]:
    acquire: List[float] = []
    release: List[float] = []
    async with permit.aio.Client(url) as client:
        async with client.session(ttl=60.0) as session:
            await client.set_capacity(name, 4)
            started = time.perf_counter()
            while time.perf_counter() - started < duration:
                t = time.perf_counter()
                p = await session.try_acquire(name)
                acquire.append(time.perf_counter() - t)
                assert p is not None, "uncontended acquire refused"
                t = time.perf_counter()
                await p.release()
                release.append(time.perf_counter() - t)
            elapsed = time.perf_counter() - started
    return summary(len(acquire) / elapsed, acquire, release)


def w2_threads(url: str, name: str, duration: float, clients: int) -> Dict[str, Any]:
    client = permit.Client(url)
    client.set_capacity(name, 4)
    sessions = [client.session(ttl=120.0) for _ in range(clients)]
    waits: List[float] = []
    lock = threading.Lock()
    state = {"now": 0, "max": 0, "cycles": 0}
    end = time.perf_counter() + duration

    def worker(session: permit.Session) -> None:
        mine: List[float] = []
        while time.perf_counter() < end:
            t = time.perf_counter()
            p = session.acquire(name, timeout=60.0)
            mine.append(time.perf_counter() - t)
            with lock:
                state["now"] += 1
                state["max"] = max(state["max"], state["now"])
                state["now"] -= 1
            p.release()
        with lock:
            waits.extend(mine)
            state["cycles"] += len(mine)

    started = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    for s in sessions:
        s.close()
    client.close()
    return {**summary(state["cycles"] / elapsed, waits, []), "max_holders": state["max"]}


async def w2_asyncio(url: str, name: str, duration: float, clients: int) -> Dict[str, Any]:
    waits: List[float] = []
    state = {"now": 0, "max": 0}
    async with permit.aio.Client(url) as client:
        await client.set_capacity(name, 4)
        sessions = [await client.session(ttl=120.0) for _ in range(clients)]
        end = time.perf_counter() + duration

        async def worker(session: permit.aio.Session) -> None:
            while time.perf_counter() < end:
                t = time.perf_counter()
                p = await session.acquire(name, timeout=60.0)
                waits.append(time.perf_counter() - t)
                state["now"] += 1
                state["max"] = max(state["max"], state["now"])
                state["now"] -= 1
                await p.release()

        started = time.perf_counter()
        await asyncio.gather(*(worker(s) for s in sessions))
        elapsed = time.perf_counter() - started
        for s in sessions:
            await s.close()
    return {**summary(len(waits) / elapsed, waits, []), "max_holders": state["max"]}


def summary(rate: float, first: List[float], second: List[float]) -> Dict[str, Any]:
    return {
        "cycles_per_second": rate,
        "p50_ms": quantile(first, 0.5) * 1e3,
        "p99_ms": quantile(first, 0.99) * 1e3,
        "release_p50_ms": quantile(second, 0.5) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", required=True)
    parser.add_argument("--name", default="py-bench")
    parser.add_argument("--workload", choices=["w1", "w2"], required=True)
    parser.add_argument("--mode", choices=["threads", "asyncio"], required=True)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args()
    if args.workload == "w1":
        if args.mode == "threads":
            out = w1_threads(args.url, args.name, args.duration)
        else:
            out = asyncio.run(w1_asyncio(args.url, args.name, args.duration))
    elif args.mode == "threads":
        out = w2_threads(args.url, args.name, args.duration, args.clients)
    else:
        out = asyncio.run(w2_asyncio(args.url, args.name, args.duration, args.clients))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
