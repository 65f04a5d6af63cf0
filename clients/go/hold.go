package permit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

const (
	// outagePauseMin and outagePauseMax bound the pauses between the asks of a waiting
	// acquire or campaign while the cluster is unavailable (after each request's own
	// retries): the server keeps the queue place as long as the session lives.
	outagePauseMin = 100 * time.Millisecond
	outagePauseMax = time.Second
)

// object is a kind of object a session waits its turn for, and the routes of that wait: every
// wait (a semaphore's acquire, an election's campaign) and the guard it grants go through
// waitTurn and guard with one of these. A queue's claim is one more entry (queues, in
// queue.go), with a wait of its own: a session may claim many items of one queue.
type object struct {
	collection string // the path segment after /v1/
	noun       string // for messages
	wait       string // the long-poll that queues and grants
	end        string // gives a hold back or a wait up
}

var (
	semaphores = &object{collection: "semaphores", noun: "semaphore", wait: "acquire", end: "release"}
	elections  = &object{collection: "elections", noun: "election", wait: "campaign", end: "resign"}
)

// path is the route of action on the object named name.
func (o *object) path(name, action string) string {
	return "/v1/" + o.collection + "/" + segment(name) + "/" + action
}

// AcquireOption configures an acquire (see Session.Acquire).
type AcquireOption func(*acquireConfig)

type acquireConfig struct {
	permits  uint64
	capacity uint64
	maxHold  time.Duration
	keep     bool
	group    string
}

// Permits sets how many permits to acquire (default 1).
func Permits(n uint64) AcquireOption { return func(c *acquireConfig) { c.permits = n } }

// Capacity creates the semaphore with c permits if it does not exist (ignored if it does).
// Such a semaphore is ephemeral: the server deletes it when its last holder and waiter leave,
// as the CLI does (see KeepSemaphore).
func Capacity(c uint64) AcquireOption { return func(cfg *acquireConfig) { cfg.capacity = c } }

// MaxHold makes the server release the hold d after the grant even if the session lives
// (100 ms to 7 days). Hold.Lost is closed when it passes.
func MaxHold(d time.Duration) AcquireOption { return func(c *acquireConfig) { c.maxHold = d } }

// KeepSemaphore keeps a semaphore that Capacity creates after its last holder and waiter
// leave (the CLI's --keep).
func KeepSemaphore() AcquireOption { return func(c *acquireConfig) { c.keep = true } }

// Group counts the acquire against group (1 to 64 bytes of A-Z a-z 0-9 . _ : -), for the
// semaphore's GroupMax: a waiter whose grant would take its group above the cap is passed over
// (keeping its place) and the others are served. A session that holds or waits keeps the group
// it named first.
func Group(group string) AcquireOption { return func(c *acquireConfig) { c.group = group } }

// Acquire waits its turn (strict FIFO, but for waiters of a Group at the semaphore's GroupMax,
// which are passed over) for permits of semaphore name, within its capacity and its Rate, and
// returns the Hold.
// The wait is pushed by the server (long-polls of at most 30 s, or the TTL if shorter, so
// that a session lost meanwhile is noticed); nothing polls. When ctx ends the queue place is
// given up on the server before Acquire returns (a grant that raced with it is released too),
// and the error unwraps to ctx's error (it matches ErrTimeout when the deadline passed).
// While the cluster is unreachable the wait asks again until the session's local deadline.
func (s *Session) Acquire(ctx context.Context, name string, opts ...AcquireOption) (*Hold, error) {
	return s.acquire(ctx, name, false, opts)
}

// TryAcquire returns the Hold if the permits are free (by the capacity, the delayed permits
// and the Rate) and nobody queues first, else an error matching ErrUnavailable at once; it
// never queues.
func (s *Session) TryAcquire(ctx context.Context, name string, opts ...AcquireOption) (*Hold, error) {
	return s.acquire(ctx, name, true, opts)
}

func (s *Session) acquire(ctx context.Context, name string, tryOnce bool, opts []AcquireOption) (*Hold, error) {
	cfg := acquireConfig{permits: 1}
	for _, opt := range opts {
		opt(&cfg)
	}
	body := func(wait time.Duration) any {
		b := map[string]any{"session": s.id, "permits": cfg.permits, "wait_ms": ms(wait)}
		if cfg.capacity != 0 {
			b["capacity"] = cfg.capacity
			if !cfg.keep {
				b["ephemeral"] = true
			}
		}
		if cfg.maxHold != 0 {
			b["max_hold_ms"] = ms(cfg.maxHold)
		}
		if cfg.group != "" {
			b["group"] = cfg.group
		}
		return b
	}
	var granted struct {
		Permits uint64 `json:"permits"`
		Token   uint64 `json:"token"`
	}
	notBefore, err := s.waitTurn(ctx, semaphores, name, tryOnce, body, &granted)
	if err != nil {
		return nil, err
	}
	h := &Hold{guard: newGuard(s, semaphores, name, granted.Token), permits: granted.Permits}
	s.adopt(&h.guard)
	if cfg.maxHold != 0 {
		// The server granted after the request that got the grant (or the last one answered
		// "waiting") was sent: the hold expires no later than that plus MaxHold.
		h.expireAt(notBefore.Add(cfg.maxHold))
	}
	return h, nil
}

// Campaign waits until this session leads election, publishing value (at most 4096 bytes,
// e.g. the leader's address), and returns the Leadership. The wait is pushed, as Acquire's;
// when ctx ends the candidacy is given up on the server before Campaign returns.
func (s *Session) Campaign(ctx context.Context, election, value string) (*Leadership, error) {
	body := func(wait time.Duration) any {
		return map[string]any{"session": s.id, "value": value, "wait_ms": ms(wait)}
	}
	var granted struct {
		Token uint64 `json:"token"`
	}
	if _, err := s.waitTurn(ctx, elections, election, false, body, &granted); err != nil {
		return nil, err
	}
	l := &Leadership{guard: newGuard(s, elections, election, granted.Token), value: value}
	s.adopt(&l.guard)
	return l, nil
}

// waitTurn claims kind/name for this session and waits for the grant (see waitGrant); the
// claim is given back when nothing was granted.
func (s *Session) waitTurn(ctx context.Context, kind *object, name string, tryOnce bool, body func(time.Duration) any, out any) (time.Time, error) {
	if err := s.check(); err != nil {
		return time.Time{}, err
	}
	if err := s.claim(kind, name); err != nil {
		return time.Time{}, err
	}
	notBefore, err := s.waitGrant(ctx, kind, name, tryOnce, body, out)
	if err != nil {
		s.unclaim(kind, name)
	}
	return notBefore, err
}

// waitGrant repeats the long-poll POST /v1/{kind}/{name}/{wait} until it is granted (200),
// returning the earliest instant the grant can have happened. Any way out other than a grant
// or a refusal gives the queue place up on the server first.
func (s *Session) waitGrant(ctx context.Context, kind *object, name string, tryOnce bool, body func(time.Duration) any, out any) (time.Time, error) {
	path := kind.path(name, kind.wait)
	// The long-polls end when the session is lost, not only when ctx does.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-wctx.Done():
		}
	}()
	var lastWaiting time.Time
	pause := outagePauseMin
	for {
		wait := s.waitSlice(ctx, tryOnce)
		sent := time.Now()
		got, err := s.client.do(wctx, call{method: "POST", path: path, body: body(wait), timeout: maxDuration(s.client.timeout, wait+longPollMargin)})
		if err != nil {
			switch {
			case s.Err() != nil:
				// Lost (or closed) meanwhile: the server dropped the wait with the session.
				return time.Time{}, s.Err()
			case ctx.Err() != nil:
				s.giveUp(kind, name)
				return time.Time{}, contextError(ctx, fmt.Sprintf("waiting for %s %s", kind.noun, name))
			case hasCode(err, "session_not_found"):
				s.lose(err.(*Error))
				return time.Time{}, err
			case errors.Is(err, ErrClusterUnavailable) && !tryOnce && !hasCode(err, "tls"):
				// An outage: the server keeps the place while the session lives, so ask
				// again until the session's local deadline (the keepalive loop then marks it
				// lost) or ctx ends.
				if sleep(wctx, pause) != nil {
					continue // the next turn returns the reason
				}
				pause = minDuration(pause*2, outagePauseMax)
				continue
			default:
				return time.Time{}, err
			}
		}
		pause = outagePauseMin
		if got.status == 200 {
			if err := got.decode(out); err != nil {
				s.giveUp(kind, name)
				return time.Time{}, err
			}
			if lastWaiting.IsZero() {
				return sent, nil
			}
			return lastWaiting, nil
		}
		// 202: still queued when the wait ended; the place is kept.
		if tryOnce {
			s.giveUp(kind, name)
			return time.Time{}, newError("unavailable", 409, "%s %s: not granted at once", kind.noun, name)
		}
		if err := s.check(); err != nil {
			return time.Time{}, err
		}
		if ctx.Err() != nil {
			s.giveUp(kind, name)
			return time.Time{}, contextError(ctx, fmt.Sprintf("waiting for %s %s", kind.noun, name))
		}
		lastWaiting = sent
	}
}

// waitSlice is how long the next long-poll asks the server to wait: at most 30 s and one TTL
// (at least 1 s), so that a session lost meanwhile is noticed, and no longer than ctx's
// deadline; at least 1 ms, so that it waits rather than tries.
func (s *Session) waitSlice(ctx context.Context, tryOnce bool) time.Duration {
	if tryOnce {
		return 0
	}
	chunk := minDuration(waitChunk, maxDuration(s.ttl, time.Second))
	if deadline, ok := ctx.Deadline(); ok {
		chunk = minDuration(chunk, time.Until(deadline))
	}
	return maxDuration(chunk, time.Millisecond)
}

// giveUp cancels the session's wait for kind/name on the server (its end route also ends a
// grant that raced with it), bounded by the client's timeout, whatever ctx did.
func (s *Session) giveUp(kind *object, name string) {
	if s.Err() != nil {
		return // the server dropped the wait with the session
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.client.timeout)
	defer cancel()
	_, err := s.client.do(ctx, call{method: "POST", path: kind.path(name, kind.end), body: map[string]string{"session": s.id}})
	if e, ok := err.(*Error); ok && e.Code == "session_not_found" {
		s.lose(e)
	}
}

func maxDuration(a, b time.Duration) time.Duration {
	if a > b {
		return a
	}
	return b
}

// guard is what a Hold and a Leadership share: the session, the token, the loss signal and
// the release.
type guard struct {
	session *Session
	kind    *object
	name    string
	token   uint64

	mu       sync.Mutex
	lost     chan struct{}
	err      *Error // why it was lost; nil if released
	ended    bool   // lost or released: lost is closed
	released bool   // Release was called
	timer    *time.Timer
}

func newGuard(s *Session, kind *object, name string, token uint64) guard {
	return guard{session: s, kind: kind, name: name, token: token, lost: make(chan struct{})}
}

// end closes lost once, with err (nil: released).
func (g *guard) end(err *Error) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ended {
		return false
	}
	g.ended = true
	if err != nil {
		g.err = &Error{Code: err.Code, Status: err.Status, Message: fmt.Sprintf("%s: %s", g.name, err.Message)}
	}
	if g.timer != nil {
		g.timer.Stop()
	}
	close(g.lost)
	return true
}

func (g *guard) markLost(err *Error) { g.end(err) }

func (g *guard) markReleased() { g.end(nil) }

func (g *guard) expireAt(at time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ended {
		return
	}
	g.timer = time.AfterFunc(time.Until(at), func() {
		g.session.drop(g)
		g.markLost(newError("hold_expired", 0, "max hold passed; the server released it"))
	})
}

func (g *guard) errNow() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err == nil {
		return nil
	}
	return g.err
}

// release gives the hold back: once, and only to the server while it may still be held.
func (g *guard) release(ctx context.Context) error {
	g.mu.Lock()
	if g.released {
		g.mu.Unlock()
		return nil
	}
	g.released = true
	wasLost := g.ended
	g.mu.Unlock()
	s := g.session
	s.drop(g)
	// Only once the release is answered: an acquire before that would get this grant.
	defer s.unclaim(g.kind, g.name)
	g.markReleased()
	if wasLost || s.Err() != nil {
		return nil
	}
	_, err := s.client.do(ctx, call{method: "POST", path: g.kind.path(g.name, g.kind.end), body: map[string]string{"session": s.id}})
	if e, ok := err.(*Error); ok && e.Code == "session_not_found" {
		s.lose(e)
		return nil
	}
	return err
}

// Hold is permits of a semaphore held by a session, with its fencing token.
type Hold struct {
	guard
	permits uint64
}

// Name is the semaphore's name.
func (h *Hold) Name() string { return h.name }

// Token is the hold's fencing token: larger than every token granted before, on any
// semaphore. Pass it to the resource the hold protects (see Client.Validate).
func (h *Hold) Token() uint64 { return h.token }

// Permits is the number of permits held.
func (h *Hold) Permits() uint64 { return h.permits }

// Lost is closed when the hold ends: its session was lost (Err matches ErrSessionLost), its
// MaxHold passed (code hold_expired), or it was released (Err is nil). Stop touching the
// protected resource when it is closed.
func (h *Hold) Lost() <-chan struct{} { return h.lost }

// Err is nil while the hold lasts and after a Release; the reason once it was lost.
func (h *Hold) Err() error { return h.errNow() }

// Release gives the permits back. It is idempotent, and does nothing on the server for a lost
// hold.
func (h *Hold) Release(ctx context.Context) error { return h.release(ctx) }

func (h *Hold) String() string {
	return fmt.Sprintf("permit.Hold(%s, permits=%d, token=%d)", h.name, h.permits, h.token)
}

// Leadership is a session's leadership of an election, with its fencing token.
type Leadership struct {
	guard
	vmu   sync.Mutex
	value string
}

// Election is the election's name.
func (l *Leadership) Election() string { return l.name }

// Token is the leadership's fencing token.
func (l *Leadership) Token() uint64 { return l.token }

// Value is the value the leader publishes, as the server last confirmed it.
func (l *Leadership) Value() string {
	l.vmu.Lock()
	defer l.vmu.Unlock()
	return l.value
}

// Lost is closed when the leadership ends: its session was lost (Err matches ErrSessionLost)
// or it resigned (Err is nil).
func (l *Leadership) Lost() <-chan struct{} { return l.lost }

// Err is nil while leading and after Resign; the reason once the leadership was lost.
func (l *Leadership) Err() error { return l.errNow() }

// Resign steps down; the next candidate becomes leader. Idempotent.
func (l *Leadership) Resign(ctx context.Context) error { return l.release(ctx) }

// Proclaim publishes value in place of the current one and keeps leading with the same token
// (etcd's Proclaim): Client.Leader and ObserveLeader see the new value. ErrConflict (code
// not_leader) when the session no longer leads, feature_unavailable when a cluster member is
// older than feature version 3; ErrSessionLost once the leadership is lost.
func (l *Leadership) Proclaim(ctx context.Context, value string) error {
	l.mu.Lock()
	released, err := l.released, l.err
	l.mu.Unlock()
	if released {
		return newError("not_leader", 0, "%s: this leadership was resigned", l.name)
	}
	if err != nil {
		return err
	}
	s := l.session
	var view Leader
	got, callErr := s.client.do(ctx, call{method: "POST", path: elections.path(l.name, "proclaim"), body: map[string]string{"session": s.id, "value": value}})
	if callErr != nil {
		if e, ok := callErr.(*Error); ok && e.Code == "session_not_found" {
			s.lose(e)
		}
		return callErr
	}
	if err := got.decode(&view); err != nil {
		return err
	}
	l.vmu.Lock()
	l.value = view.Value
	l.vmu.Unlock()
	return nil
}

func (l *Leadership) String() string {
	return fmt.Sprintf("permit.Leadership(%s, token=%d)", l.name, l.token)
}
