package permit

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Error is every error the client returns for a failed call: the server's stable error code
// and HTTP status, or a code found on this side with Status 0.
//
// Code is one of the server's codes ("semaphore_not_found", "unavailable", ...; see ErrorCode
// in docs/openapi.json) or one of this client's: "connection" (no endpoint answered), "tls"
// (the TLS handshake failed; not retried), "protocol" (an answer this client cannot decode),
// "session_lost" (no keepalive was acknowledged before the session's local deadline),
// "session_closed", "client_closed", "hold_expired" (a MaxHold passed), "already_held" (this session already
// holds or is acquiring the name), "canceled" and "deadline_exceeded" (the call's context
// ended; the error unwraps to context.Canceled or context.DeadlineExceeded).
//
// Programs branch with errors.Is on the sentinels (ErrUnavailable, ErrSessionLost, ...) and
// read the details with errors.As.
type Error struct {
	Code    string
	Status  int
	Message string
	// RetryAfter is how long until the server expects the request to succeed, when it said:
	// the retry_after_ms of a rate_limited answer (a Take the rate had no room for), else the
	// Retry-After header (whole seconds; a limit_exceeded answer may send one). 0 when it did
	// not say.
	RetryAfter time.Duration

	cause error
}

func (e *Error) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("permit: %s (%d): %s", e.Code, e.Status, e.Message)
	}
	return fmt.Sprintf("permit: %s: %s", e.Code, e.Message)
}

// Unwrap gives the context's error for the codes "canceled" and "deadline_exceeded".
func (e *Error) Unwrap() error { return e.cause }

// Is reports whether target is one of the sentinels this error's code belongs to.
func (e *Error) Is(target error) bool {
	for _, sentinel := range codes[e.Code] {
		if sentinel == target {
			return true
		}
	}
	return false
}

// The sentinels: errors.Is(err, permit.ErrUnavailable) tells what kind of failure a call met.
// One code may belong to several (unavailable is also a conflict; no_leader is also a cluster
// outage).
var (
	// ErrInvalidRequest: the server refused the request as malformed or out of range; retrying
	// the same request cannot fix it.
	ErrInvalidRequest = errors.New("permit: invalid request")
	// ErrNotFound: the semaphore, route or access token does not exist.
	ErrNotFound = errors.New("permit: not found")
	// ErrConflict: the request conflicts with the state (more permits than the capacity, a
	// busy semaphore, a leader that no longer leads, ...).
	ErrConflict = errors.New("permit: conflict")
	// ErrUnavailable: a TryAcquire or a zero wait was refused, too few free permits or others
	// queued first.
	ErrUnavailable = errors.New("permit: unavailable")
	// ErrClaimLost: the claim of a queue item ended (its session was lost, it was acked or
	// nacked already, or an admin removed the item); an Ack or Nack changed nothing.
	ErrClaimLost = errors.New("permit: claim lost")
	// ErrAlreadyHeld: this session already holds or is acquiring that name through another
	// Hold or Leadership; nothing was sent.
	ErrAlreadyHeld = errors.New("permit: already held by this session")
	// ErrSessionLost: the session, and every hold and leadership it had, is gone or presumed
	// gone (also a hold whose MaxHold passed, and a closed session).
	ErrSessionLost = errors.New("permit: session lost")
	// ErrLimitExceeded: a documented server limit was reached, or a semaphore's rate
	// (ErrRateLimited); see Error.RetryAfter.
	ErrLimitExceeded = errors.New("permit: limit exceeded")
	// ErrRateLimited: a Take found no room in the semaphore's rate within its wait (code
	// rate_limited, HTTP 429); nothing was taken. Error.RetryAfter says when the rate has room.
	// It is also an ErrLimitExceeded.
	ErrRateLimited = errors.New("permit: rate limited")
	// ErrUnauthenticated: auth is on and the request has no valid token.
	ErrUnauthenticated = errors.New("permit: unauthenticated")
	// ErrPermissionDenied: the token lacks the permission.
	ErrPermissionDenied = errors.New("permit: permission denied")
	// ErrNoLeader: the cluster has no reachable leader now (after the client's retries).
	ErrNoLeader = errors.New("permit: no leader")
	// ErrClusterUnavailable: no node could do the work now: no leader, shutting down, a
	// storage failure, a write not committed in time, or no endpoint answered.
	ErrClusterUnavailable = errors.New("permit: cluster unavailable")
	// ErrTimeout: the call did not complete in time: the context's deadline passed (the queue
	// place of a wait is given up), or the server did not commit a write in time.
	ErrTimeout = errors.New("permit: timeout")
	// ErrInternal: a bug or an I/O failure on the server, or an answer this client cannot
	// decode.
	ErrInternal = errors.New("permit: internal error")
)

// codes maps every error code, the server's (ErrorCode in docs/openapi.json; a test checks
// that each one is here) and this client's, to its sentinels. A code the server adds later
// matches none until it is added here.
var codes = map[string][]error{
	"malformed_json":                {ErrInvalidRequest},
	"invalid_body":                  {ErrInvalidRequest},
	"unsupported_media_type":        {ErrInvalidRequest},
	"body_too_large":                {ErrInvalidRequest},
	"invalid_name":                  {ErrInvalidRequest},
	"invalid_argument":              {ErrInvalidRequest},
	"not_found":                     {ErrNotFound},
	"method_not_allowed":            {ErrInvalidRequest},
	"session_not_found":             {ErrSessionLost},
	"semaphore_not_found":           {ErrNotFound},
	"unavailable":                   {ErrUnavailable, ErrConflict},
	"permits_exceed_capacity":       {ErrConflict},
	"permits_mismatch":              {ErrConflict},
	"semaphore_busy":                {ErrConflict},
	"wait_cancelled":                {ErrConflict},
	"limit_exceeded":                {ErrLimitExceeded},
	"no_leader":                     {ErrNoLeader, ErrClusterUnavailable},
	"shutting_down":                 {ErrClusterUnavailable},
	"internal":                      {ErrInternal},
	"timeout":                       {ErrTimeout, ErrClusterUnavailable},
	"already_initialized":           {ErrConflict},
	"membership_change_in_progress": {ErrConflict},
	"leader_unreachable":            {ErrNoLeader, ErrClusterUnavailable},
	"unauthenticated":               {ErrUnauthenticated},
	"permission_denied":             {ErrPermissionDenied},
	"token_not_found":               {ErrNotFound},
	"storage_error":                 {ErrClusterUnavailable},
	"tls_required":                  {ErrInvalidRequest},
	"body_timeout":                  {ErrInvalidRequest},
	"misdirected_request":           {ErrInvalidRequest},
	"feature_unavailable":           {ErrConflict},
	"wrong_cluster":                 {ErrConflict},
	"not_leader":                    {ErrConflict},
	"queue_not_found":               {ErrNotFound},
	"queue_busy":                    {ErrConflict},
	"queue_full":                    {ErrConflict},
	"payload_too_large":             {ErrInvalidRequest},
	"claim_lost":                    {ErrClaimLost, ErrConflict},
	"item_not_found":                {ErrNotFound},
	"rate_limited":                  {ErrRateLimited, ErrLimitExceeded},

	// Found on this side.
	"connection":        {ErrClusterUnavailable},
	"tls":               {ErrClusterUnavailable},
	"protocol":          {ErrInternal},
	"session_lost":      {ErrSessionLost},
	"session_closed":    {ErrSessionLost},
	"hold_expired":      {ErrSessionLost},
	"already_held":      {ErrAlreadyHeld, ErrConflict},
	"client_closed":     {},
	"canceled":          {},
	"deadline_exceeded": {ErrTimeout},
}

func newError(code string, status int, format string, args ...any) *Error {
	return &Error{Code: code, Status: status, Message: fmt.Sprintf(format, args...)}
}

// contextError is the error of a call whose context ended: it unwraps to the context's error.
func contextError(ctx context.Context, what string) *Error {
	cause := ctx.Err()
	if errors.Is(cause, context.DeadlineExceeded) {
		return &Error{Code: "deadline_exceeded", Message: what + ": the context's deadline passed", cause: cause}
	}
	return &Error{Code: "canceled", Message: what + ": the context was canceled", cause: cause}
}

// hasCode reports whether err is an *Error with code.
func hasCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}
