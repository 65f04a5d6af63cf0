"""What the blocking client does its own way: waiting, background threads, and
``close_sessions_on_sigterm``. The same functions as ``_async_io`` (see there), for threads."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, List, Optional, TypeVar

from ._common import ONE_PASS, KeepaliveBatcher

if TYPE_CHECKING:
    from ._sync import Session

T = TypeVar("T")

log = logging.getLogger("permit")

#: Step of a wait that also watches a ``stop`` event.
STOP_POLL = 0.05


def wait_event(event: threading.Event, timeout: float, stop: Optional[threading.Event] = None) -> bool:
    """Waits until ``event`` is set or ``timeout`` seconds pass; whether it is set. With
    ``stop``, also until ``stop`` is set (polled in short steps: a thread cannot be cancelled)."""
    if stop is None:
        return event.wait(max(0.0, timeout))
    end = time.monotonic() + timeout
    while not event.is_set() and not stop.is_set():
        left = end - time.monotonic()
        if left <= 0:
            break
        event.wait(min(STOP_POLL, left))
    return event.is_set()


def spawn(run: Callable[[], None], name: str) -> threading.Thread:
    """Runs ``run()`` in the background on a daemon thread."""
    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def join(thread: threading.Thread, timeout: float) -> None:
    """Waits up to ``timeout`` seconds for ``thread`` to end (unless it is the caller)."""
    if threading.current_thread() is not thread:
        thread.join(timeout=timeout)


def unless_set(result: T, event: threading.Event, error: BaseException) -> T:
    """``result``: a blocking call cannot be interrupted, it has returned already."""
    return result


def wait_riders(batcher: KeepaliveBatcher, riders: int) -> None:
    """Lets the ``riders`` sessions a departing batch woke ask to join it (bounded)."""
    if riders:
        batcher.wait_joined(riders)


def is_cancellation(error: BaseException) -> bool:
    return False


# The sessions of this process not closed yet, for ``close_sessions_on_sigterm``.
_LIVE: "weakref.WeakSet[Session]" = weakref.WeakSet()
# The handler that ``close_sessions_on_sigterm`` replaced, once installed.
_PREVIOUS_SIGTERM: List[Any] = []
#: Longest the SIGTERM handler spends closing each session on the server.
SIGTERM_CLOSE_TIMEOUT = 2.0


def track(session: "Session") -> None:
    """Counts ``session`` among those ``close_sessions_on_sigterm`` closes."""
    _LIVE.add(session)


def untrack(session: "Session") -> None:
    _LIVE.discard(session)


def close_sessions_on_sigterm() -> None:
    """Installs a SIGTERM handler that closes every open session of this process on the
    server (``DELETE /v1/sessions/{id}``, at most ``SIGTERM_CLOSE_TIMEOUT`` seconds each), so
    that a worker stopped by a supervisor frees its permits and leaderships at once rather
    than when its TTL runs out, then hands the signal to the handler it replaced: the
    application's own handler if it installed one (call this after it), else the default
    action (the process ends by SIGTERM, as it would have), or nothing if SIGTERM was ignored.

    Opt-in, not installed on import: a library must not take over an application's signals
    behind its back, and only the main thread may install handlers (``ValueError``
    otherwise). Calling it again does nothing. The sessions' objects are not touched (the
    handler runs between two bytecodes of the main thread, which may be inside them); if the
    process goes on after the signal, their keepalives find the sessions gone and report them
    lost (``on_lost``). It covers the blocking client's sessions; an asyncio application
    closes its :mod:`permit.aio` sessions from its own ``loop.add_signal_handler`` callback.

    Example::

        permit.close_sessions_on_sigterm()
        with client.session() as session, session.acquire("migrations", capacity=4):
            migrate()   # `kill -TERM` frees the permit at once
    """
    if _PREVIOUS_SIGTERM:
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    _PREVIOUS_SIGTERM.append(previous)


def _live_sessions() -> "List[Session]":
    # No lock: the main thread, which this handler interrupted, may hold it. A copy that races
    # with another thread opening or closing a session is tried again (bounded).
    for _ in range(10):
        try:
            return list(_LIVE)
        except RuntimeError:  # the set changed size during the copy
            continue
    return []


def _on_sigterm(signum: int, frame: Any) -> None:
    pid = os.getpid()
    for session in _live_sessions():
        if session._pid != pid or session._closed or session.lost.is_set():
            continue
        # A fresh pool: the main thread may have been interrupted inside the session's own.
        http = session.client._new_pool()
        try:
            session.client._request(
                "DELETE", f"/v1/sessions/{session.id}", policy=ONE_PASS, timeout=SIGTERM_CLOSE_TIMEOUT, http=http
            )
        except Exception as error:  # it expires on its own
            log.debug("closing session %s on SIGTERM: %s", session.id, error)
        finally:
            http.close()
    previous = _PREVIOUS_SIGTERM[0] if _PREVIOUS_SIGTERM else signal.SIG_DFL
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:
        # The default action (also for a handler installed outside Python, ``None``): end by
        # the signal, as the process would have without this handler.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(pid, signal.SIGTERM)
