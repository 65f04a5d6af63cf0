"""Errors: one base class, subclasses by meaning, and the table of the server's error codes."""

from __future__ import annotations

from typing import Dict, Optional, Type


class PermitError(Exception):
    """Every error this client raises.

    ``code`` is the server's stable error code (``"semaphore_not_found"``, ...) or, for errors
    found on this side, one of ``"connection"``, ``"tls"``, ``"protocol"``, ``"wait_timeout"``,
    ``"session_lost"`` and ``"session_forked"``; ``status`` is the HTTP status (0 when there
    was no answer) and ``message`` says what went wrong, for humans.

    Example::

        try:
            client.set_capacity("gpu", 0)
        except permit.PermitError as error:
            print(error.code, error.status, error.message)   # invalid_argument 400 ...
    """

    def __init__(self, code: str, status: int, message: str) -> None:
        super().__init__(f"{code} ({status}): {message}" if status else f"{code}: {message}")
        self.code = code
        self.status = status
        self.message = message


class InvalidRequest(PermitError):
    """The server refused the request as malformed or out of range (a 4xx that retrying the
    same request cannot fix): ``invalid_argument``, ``invalid_name``, ``invalid_body``, ...

    Example::

        with pytest.raises(permit.InvalidRequest):
            client.set_capacity("bad name!", 1)
    """


class NotFound(PermitError):
    """The semaphore, queue, item, route or access token does not exist.

    Example::

        try:
            client.semaphore("nothing-here")
        except permit.NotFound:
            pass
    """


class Conflict(PermitError):
    """The request conflicts with the state: more permits than the capacity, a different count
    than the session already holds, a busy semaphore or queue, a full queue, a cancelled wait, a
    membership change, an ack or nack of a claim that ended (``claim_lost``).

    Example::

        try:
            session.acquire("gpu", permits=9)     # capacity 8
        except permit.Conflict as error:
            assert error.code == "permits_exceed_capacity"
    """


class Unavailable(Conflict):
    """A try-acquire (or try-campaign) was refused: too few free permits or others queued first
    (``unavailable``); or a claim with ``timeout=0`` found no item due. ``Session.try_acquire``
    and ``Session.try_claim`` answer ``None`` instead of raising this.

    Example::

        try:
            session.acquire("gpu", timeout=0)   # same as try_acquire, but raising
        except permit.Unavailable:
            pass
    """


class AlreadyHeld(Conflict):
    """This session already holds (or is acquiring) that semaphore or election through another
    :class:`Permit` or :class:`Leadership` (``already_held``, found on this side; nothing was
    sent). The server answers a repeated acquire with the grant the session has, so a second
    guard would share the first one's hold, and its exit would release the hold the first one
    still guards. Use the guard you have, or another session.

    Example::

        with session.acquire("migrations"):
            try:
                session.acquire("migrations")
            except permit.AlreadyHeld:
                pass   # the outer hold is untouched
    """


class LimitExceeded(PermitError):
    """A documented server limit was reached (``limit_exceeded``); ``retry_after`` is the
    server's ``Retry-After`` in seconds, if it sent one.

    Example::

        try:
            client.session()
        except permit.LimitExceeded as error:
            time.sleep(error.retry_after or 1.0)
    """

    retry_after: Optional[float] = None


class RateLimited(LimitExceeded):
    """A semaphore's rate refused a :meth:`Client.take` (``rate_limited``): nothing was
    taken. ``retry_after`` is when the rate allows it, in seconds (the server's
    ``retry_after_ms``, to the millisecond).

    Example::

        try:
            client.take("api.quota")
        except permit.RateLimited as error:
            time.sleep(error.retry_after or 1.0)
    """


class AuthError(PermitError):
    """Auth is on and the request has no valid token (``unauthenticated``) or lacks the
    permission (``permission_denied``).

    Example::

        client = permit.Client(url, auth_token=os.environ["PERMIT_AUTH_TOKEN"])
    """


class ClusterUnavailable(PermitError):
    """No node could do the work now: ``no_leader``, ``leader_unreachable``, ``shutting_down``,
    ``storage_error``, the server's ``timeout`` (a write not committed in time), or no
    endpoint answered (``connection``). Idempotent calls were already retried with backoff.

    Example::

        try:
            client.validate("gpu", token)
        except permit.ClusterUnavailable:
            ...  # every endpoint failed for a few seconds
    """


class InternalError(PermitError):
    """A bug or an I/O failure on the server (``internal``), or an answer this client cannot
    decode (``protocol``).

    Example::

        except permit.InternalError as error:
            log.error("permit server failed: %s", error.message)
    """


class Timeout(PermitError):
    """An acquire or campaign did not succeed within its ``timeout``, its queue place was given
    up; or no item came to a claim within its ``timeout`` (code ``wait_timeout``).

    Example::

        try:
            with session.acquire("gpu", timeout=5.0) as p:
                ...
        except permit.Timeout:
            print("still busy after 5 s; not queued any more")
    """


class SessionLost(PermitError):
    """The session (and so every permit, leadership and claimed item it held) is gone or
    presumed gone: the server said ``session_not_found``, or no keepalive was acknowledged
    before the conservative local deadline, or the hold's ``max_hold`` passed.

    Example::

        try:
            write_with_fence(p.token)
        except permit.SessionLost:
            ...  # stop touching the protected resource
    """


class SessionForked(PermitError):
    """The session was created by another process (this one is a ``fork()`` of it): a child
    must not keep alive, use or close its parent's session. Open a new session in the child.

    Example::

        if os.fork() == 0:
            session.try_acquire("gpu")   # raises permit.SessionForked
    """


#: Every error code of the server (``ErrorCode`` in ``docs/openapi.json``) and its class.
#: Codes the server adds later map to :class:`PermitError` itself.
CODES: Dict[str, Type[PermitError]] = {
    "malformed_json": InvalidRequest,
    "invalid_body": InvalidRequest,
    "unsupported_media_type": InvalidRequest,
    "body_too_large": InvalidRequest,
    "invalid_name": InvalidRequest,
    "invalid_argument": InvalidRequest,
    "not_found": NotFound,
    "method_not_allowed": InvalidRequest,
    "session_not_found": SessionLost,
    "semaphore_not_found": NotFound,
    "unavailable": Unavailable,
    "permits_exceed_capacity": Conflict,
    "permits_mismatch": Conflict,
    "semaphore_busy": Conflict,
    "wait_cancelled": Conflict,
    "limit_exceeded": LimitExceeded,
    "no_leader": ClusterUnavailable,
    "shutting_down": ClusterUnavailable,
    "internal": InternalError,
    "timeout": ClusterUnavailable,
    "already_initialized": Conflict,
    "membership_change_in_progress": Conflict,
    "leader_unreachable": ClusterUnavailable,
    "unauthenticated": AuthError,
    "permission_denied": AuthError,
    "token_not_found": NotFound,
    "storage_error": ClusterUnavailable,
    "tls_required": InvalidRequest,
    "body_timeout": InvalidRequest,
    "misdirected_request": InvalidRequest,
    "feature_unavailable": Conflict,
    "wrong_cluster": Conflict,
    "not_leader": Conflict,
    "queue_not_found": NotFound,
    "queue_busy": Conflict,
    "queue_full": Conflict,
    "payload_too_large": InvalidRequest,
    "claim_lost": Conflict,
    "item_not_found": NotFound,
    "rate_limited": RateLimited,
}


def error_for(code: str, status: int, message: str) -> PermitError:
    """The exception for a server error answer; unknown codes give a plain PermitError."""
    cls = CODES.get(code, PermitError)
    return cls(code, status, message)
