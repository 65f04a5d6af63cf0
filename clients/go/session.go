package permit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// defaultTTL is a session's TTL when SessionTTL is not given (the server's default too).
	defaultTTL = 10 * time.Second
	// retryPauseMin and retryPauseMax bound the pause between keepalive retries while in
	// jeopardy: ttl/10 within these bounds.
	retryPauseMin = 10 * time.Millisecond
	retryPauseMax = time.Second
	// keepaliveTimeoutMin is the shortest client-side timeout of one keepalive.
	keepaliveTimeoutMin = 100 * time.Millisecond
)

// SessionOption configures a session (see Client.NewSession).
type SessionOption func(*sessionConfig)

type sessionConfig struct {
	ttl  time.Duration
	name string
}

// SessionTTL sets how long the session lives after its last acknowledged keepalive (the
// server accepts 200 ms to 24 h; default 10 s). Keepalives go every ttl/3.
func SessionTTL(d time.Duration) SessionOption { return func(c *sessionConfig) { c.ttl = d } }

// SessionName gives the session a name for humans, shown by the server's reads and the CLI.
func SessionName(name string) SessionOption { return func(c *sessionConfig) { c.name = name } }

// Session is a client's liveness on the server: holds and waits belong to it, and end with it.
// A goroutine keeps it alive every ttl/3; the keepalives of all sessions of one Client go
// together in batched requests. The session is presumed lost at its conservative local
// deadline, the send time of the last acknowledged keepalive plus the TTL: by then the server
// may have expired it. Then Done is closed, and the Lost channel of every hold, leadership
// and claimed item it had.
//
// A Session is safe for concurrent use; one session may hold several semaphores and elections
// at once, one hold per name, and any number of claimed queue items.
type Session struct {
	client *Client
	id     string
	ttl    time.Duration
	name   string

	mu       sync.Mutex
	ackSent  time.Time // send time of the last acknowledged keepalive (or of the creation)
	deadline time.Time // ackSent + ttl: presumed lost from then on
	jeopardy bool      // the last keepalive failed; retrying until the deadline
	err      *Error    // why Done was closed
	guards   map[*guard]struct{}
	claims   map[string]struct{} // kind/name of every hold or wait in progress: one guard each

	done     chan struct{} // closed when lost or closed
	stop     chan struct{} // closed to end the keepalive loop
	life     context.Context
	endLife  context.CancelFunc // with stop: ends a keepalive request in flight
	wake     chan struct{}      // pokes the keepalive loop: a batch departs
	departed atomic.Bool
	loopDone chan struct{}
	stopOnce sync.Once
}

// NewSession creates a session on the server and starts keeping it alive. ctx bounds the
// creation only; the session lives until Close, the client's Close, or its loss.
//
// The creation is sent again only when it certainly did not reach a leader (a refused
// connection, leader_unreachable): a session made by a request whose answer was lost is
// never used and expires after its TTL.
func (c *Client) NewSession(ctx context.Context, opts ...SessionOption) (*Session, error) {
	cfg := sessionConfig{ttl: defaultTTL}
	for _, opt := range opts {
		opt(&cfg)
	}
	body := map[string]any{"ttl_ms": ms(cfg.ttl)}
	if cfg.name != "" {
		body["name"] = cfg.name
	}
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	sent := time.Now()
	got, err := c.do(ctx, call{method: "POST", path: "/v1/sessions", body: body, policy: unsent})
	if err != nil {
		return nil, err
	}
	var created struct {
		ID    string `json:"id"`
		TTLMs uint64 `json:"ttl_ms"`
	}
	if err := got.decode(&created); err != nil {
		return nil, err
	}
	ttl := time.Duration(created.TTLMs) * time.Millisecond
	s := &Session{
		client:   c,
		id:       created.ID,
		ttl:      ttl,
		name:     cfg.name,
		ackSent:  sent,
		deadline: sent.Add(ttl),
		guards:   map[*guard]struct{}{},
		claims:   map[string]struct{}{},
		done:     make(chan struct{}),
		stop:     make(chan struct{}),
		wake:     make(chan struct{}, 1),
		loopDone: make(chan struct{}),
	}
	s.life, s.endLife = context.WithCancel(context.Background())
	c.mu.Lock()
	closed := c.closed
	if !closed {
		c.sessions[s] = struct{}{}
	}
	c.mu.Unlock()
	if closed {
		go s.closeOnServer()
		return nil, newError("client_closed", 0, "the client was closed")
	}
	go s.keepalive()
	return s, nil
}

// ID is the session's id on the server.
func (s *Session) ID() string { return s.id }

// TTL is the session's TTL as the server confirmed it.
func (s *Session) TTL() time.Duration { return s.ttl }

// Done is closed when the session is lost (the server no longer knows it, or no keepalive was
// acknowledged before the local deadline) or closed; Err then says which.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err is nil while the session lives, then an *Error matching ErrSessionLost: code
// session_not_found or session_lost when it was lost, session_closed when it was closed.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		return nil
	}
	return s.err
}

// Deadline is the instant after which the session is presumed lost unless a keepalive is
// acknowledged first.
func (s *Session) Deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline
}

// Close stops the keepalive and closes the session on the server, which releases everything
// it holds and cancels its waits. Closing twice does nothing; closing a lost session only
// stops its goroutine.
func (s *Session) Close(ctx context.Context) error {
	s.mu.Lock()
	already := s.err != nil
	if !already {
		s.err = newError("session_closed", 0, "session %s was closed", s.id)
	}
	guards := s.takeGuards()
	s.mu.Unlock()
	s.halt()
	<-s.loopDone
	s.forget()
	for _, g := range guards {
		g.markReleased()
	}
	if already {
		return nil
	}
	close(s.done)
	_, err := s.client.do(ctx, call{method: "DELETE", path: "/v1/sessions/" + s.id})
	if hasCode(err, "session_not_found") {
		return nil
	}
	return err
}

func (s *Session) forget() {
	s.client.mu.Lock()
	delete(s.client.sessions, s)
	s.client.mu.Unlock()
}

func (s *Session) halt() {
	s.stopOnce.Do(func() {
		close(s.stop)
		s.endLife()
	})
}

// takeGuards empties the session's guards (with s.mu held).
func (s *Session) takeGuards() []*guard {
	out := make([]*guard, 0, len(s.guards))
	for g := range s.guards {
		out = append(out, g)
	}
	s.guards = map[*guard]struct{}{}
	return out
}

// lose marks the session lost with err: Done and every guard's Lost are closed.
func (s *Session) lose(err *Error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	s.err = err
	guards := s.takeGuards()
	s.mu.Unlock()
	close(s.done)
	s.halt()
	s.forget()
	for _, g := range guards {
		g.markLost(err)
	}
}

// check is the error of using a session that is lost or closed.
func (s *Session) check() error {
	if err := s.Err(); err != nil {
		return err
	}
	return nil
}

func (s *Session) closeOnServer() {
	ctx, cancel := context.WithTimeout(context.Background(), s.client.timeout)
	defer cancel()
	_, _ = s.client.do(ctx, call{method: "DELETE", path: "/v1/sessions/" + s.id})
}

// keepalive is the session's goroutine: a keepalive every ttl/3 after the last acknowledged
// one (every ttl/10 while one fails), riding along with any batch of the client past half
// its period; lost at the local deadline, or when the server says the session is gone.
func (s *Session) keepalive() {
	defer close(s.loopDone)
	batcher := s.client.batcher
	n := len(s.client.endpoints)
	for {
		s.mu.Lock()
		ackSent, deadline, jeopardy := s.ackSent, s.deadline, s.jeopardy
		s.mu.Unlock()
		now := time.Now()
		due := ackSent.Add(s.ttl / 3)
		if jeopardy {
			due = now.Add(retryPause(s.ttl))
		}
		wake := minTime(due, deadline)
		// Past half its period, a healthy session rides along with any batch this client
		// sends: the sessions of one client fall into step and share their requests.
		rideFrom := ackSent.Add(s.ttl / 6)
		if !jeopardy {
			if !now.Before(rideFrom) {
				batcher.ride(s)
			} else {
				wake = minTime(wake, rideFrom)
			}
		}
		timer := time.NewTimer(wake.Sub(now))
		select {
		case <-s.stop:
		case <-s.wake:
		case <-timer.C:
		}
		timer.Stop()
		batcher.unride(s)
		departed := s.departed.Swap(false)
		select {
		case <-s.stop:
			return
		default:
		}
		sent := time.Now()
		if !sent.Before(deadline) {
			s.lose(newError("session_lost", 0, "session %s: no keepalive was acknowledged before the local deadline", s.id))
			s.closeOnServer()
			return
		}
		if sent.Before(due) && !departed {
			continue // woken to ride from now on
		}
		left := deadline.Sub(sent)
		renewal, err := batcher.keepalive(s, keepaliveTimeout(left, n), left)
		select {
		case <-s.stop:
			return // closed while it waited: the answer no longer matters
		default:
		}
		if err != nil {
			var e *Error
			if errors.As(err, &e) && e.Code == "session_not_found" {
				s.lose(e)
				return
			}
			s.mu.Lock()
			s.jeopardy = true
			s.mu.Unlock()
			continue
		}
		s.mu.Lock()
		// renewal.sent is when the request that carried it left (at or after this loop
		// asked): the server renewed after that.
		s.ackSent = renewal.sent
		if next := renewal.sent.Add(minDuration(s.ttl, renewal.ttl)); next.After(s.deadline) {
			s.deadline = next
		}
		s.jeopardy = false
		s.mu.Unlock()
	}
}

// onDeparture wakes the keepalive loop to join a batch that is leaving.
func (s *Session) onDeparture() {
	s.departed.Store(true)
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func retryPause(ttl time.Duration) time.Duration {
	pause := ttl / 10
	if pause < retryPauseMin {
		return retryPauseMin
	}
	return minDuration(pause, retryPauseMax)
}

func keepaliveTimeout(left time.Duration, endpoints int) time.Duration {
	t := left / time.Duration(endpoints)
	if t < keepaliveTimeoutMin {
		t = keepaliveTimeoutMin
	}
	return minDuration(t, defaultTimeout)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// claim marks kind/name as held or awaited by this session, or fails with already_held: the
// server answers a repeated acquire with the grant the session has, so a second guard would
// share the first one's hold and its Release would free the hold the first still guards.
func (s *Session) claim(kind *object, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := kind.collection + "/" + name
	if _, ok := s.claims[key]; ok {
		return newError("already_held", 0, "session %s already holds or is acquiring %s %s; use the guard you have, or another session", s.id, kind.noun, name)
	}
	s.claims[key] = struct{}{}
	return nil
}

func (s *Session) unclaim(kind *object, name string) {
	s.mu.Lock()
	delete(s.claims, kind.collection+"/"+name)
	s.mu.Unlock()
}

// adopt counts g among the session's guards, or marks it lost at once if the session is.
func (s *Session) adopt(g *guard) {
	s.mu.Lock()
	err := s.err
	if err == nil {
		s.guards[g] = struct{}{}
	}
	s.mu.Unlock()
	if err != nil {
		g.markLost(err)
	}
}

func (s *Session) drop(g *guard) {
	s.mu.Lock()
	delete(s.guards, g)
	s.mu.Unlock()
}

func (s *Session) String() string { return fmt.Sprintf("permit.Session(%s)", s.id) }
