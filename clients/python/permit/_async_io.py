"""What the asyncio client does its own way: waiting, background tasks, races, and the
:class:`Pending` that ``session``, ``acquire``, ``campaign`` and ``claim`` return. ``_sync_io`` has the same
functions for threads; ``gen_sync.py`` makes the blocking client from :mod:`permit.aio` by
importing that module instead of this one."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any, Awaitable, Callable, Coroutine, Generator, Optional, Protocol, Set, Type, TypeVar

from ._common import KeepaliveBatcher

T = TypeVar("T")

# Running background tasks, referenced so that they are not collected mid-run.
_TASKS: "Set[asyncio.Task[None]]" = set()

#: Rounds of the event loop a departing keepalive batch gives the sessions it woke to join it.
RIDER_TURNS = 16


async def wait_event(event: asyncio.Event, timeout: float, stop: Optional[asyncio.Event] = None) -> bool:
    """Waits until ``event`` is set or ``timeout`` seconds pass; whether it is set. ``stop`` is
    for threads, which cannot be cancelled: a task is (``Session.close`` cancels its own)."""
    try:
        await asyncio.wait_for(event.wait(), max(0.0, timeout))
    except asyncio.TimeoutError:
        pass
    return event.is_set()


def spawn(run: Callable[[], Coroutine[Any, Any, None]], name: str) -> "asyncio.Task[None]":
    """Runs ``run()`` in the background as a task of the running loop."""
    task = asyncio.get_running_loop().create_task(run(), name=name)
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)
    return task


async def join(task: "asyncio.Task[None]", timeout: float) -> None:
    """Waits up to ``timeout`` seconds for ``task`` to end (unless it is the caller), then
    cancels it."""
    if task is asyncio.current_task():
        return
    try:
        await asyncio.wait_for(task, timeout)
    except (asyncio.TimeoutError, asyncio.CancelledError):
        task.cancel()


async def unless_set(call: Awaitable[T], event: asyncio.Event, error: BaseException) -> T:
    """``call``'s result; if ``event`` is set first, ``call`` is cancelled and ``error`` raised.
    Cancelling the caller cancels ``call`` too."""
    request = asyncio.ensure_future(call)
    setting = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({request, setting}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        setting.cancel()
        set_first = not request.done()
        if set_first:
            request.cancel()
    if set_first:
        raise error
    return request.result()


async def wait_riders(batcher: KeepaliveBatcher, riders: int) -> None:
    """Lets the ``riders`` sessions a departing batch woke ask to join it: they run at the next
    turns of the loop (a bounded number)."""
    for _ in range(RIDER_TURNS):
        if batcher.joined() >= riders:
            return
        await asyncio.sleep(0)


def is_cancellation(error: BaseException) -> bool:
    return isinstance(error, asyncio.CancelledError)


def track(session: object) -> None:
    """Nothing: ``close_sessions_on_sigterm`` is for the blocking client's sessions."""


def untrack(session: object) -> None:
    """Nothing, as ``track``."""


class _Guard(Protocol):
    async def __aexit__(
        self, kind: Optional[Type[BaseException]], value: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None: ...


G = TypeVar("G", bound=_Guard)


class Pending(Coroutine[Any, Any, G]):
    """What :meth:`Client.session`, :meth:`Session.acquire`, :meth:`Session.campaign` and
    :meth:`Session.claim` return: ``await`` it for the session, permit, leadership or item, or
    use it directly in ``async with``, which on exit closes the session or releases the hold
    (also on an exception), or acks the item (nacks it on an exception).
    A coroutine, so ``asyncio.create_task`` takes it too. Cancelling a task that waits in it
    gives the queue place up.

    Example::

        async with client.session(ttl=10.0) as session:
            async with session.acquire("gpu", capacity=8) as p:   # released at the block's end
                do_work(p.token)
            p = await session.acquire("gpu")   # held until released
            try:
                do_work(p.token)
            finally:
                await p.release()
    """

    __slots__ = ("_call", "_entered")

    def __init__(self, call: Coroutine[Any, Any, G]) -> None:
        self._call = call
        self._entered: Optional[G] = None

    def __await__(self) -> Generator[Any, None, G]:
        return self._call.__await__()

    def send(self, value: Any) -> Any:
        return self._call.send(value)

    def throw(self, *error: Any) -> Any:
        return self._call.throw(*error)

    def close(self) -> None:
        self._call.close()

    async def __aenter__(self) -> G:
        self._entered = await self._call
        return self._entered

    async def __aexit__(
        self, kind: Optional[Type[BaseException]], value: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        assert self._entered is not None
        await self._entered.__aexit__(kind, value, tb)
