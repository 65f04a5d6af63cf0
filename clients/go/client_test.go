package permit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"permit.dev/go/permit"
)

// bounded is the context of a test's calls: no test waits forever.
func bounded(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func newName(t *testing.T) string {
	return fmt.Sprintf("go.%x", rand.Uint64())
}

func newClient(t *testing.T, endpoints []string, opts ...permit.Option) *permit.Client {
	t.Helper()
	c, err := permit.NewClient(endpoints, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func newSession(t *testing.T, ctx context.Context, c *permit.Client, opts ...permit.SessionOption) *permit.Session {
	t.Helper()
	s, err := c.NewSession(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestAcquireValidateReleaseAndTokensGrow(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 20*time.Second)
	c := newClient(t, []string{shared.URL})
	s := newSession(t, ctx, c, permit.SessionName("go-test"))
	name := newName(t)
	var last uint64
	for i := 0; i < 3; i++ {
		h, err := s.Acquire(ctx, name, permit.Permits(2), permit.Capacity(3))
		if err != nil {
			t.Fatal(err)
		}
		if h.Permits() != 2 || h.Token() <= last {
			t.Fatalf("grant %d: %v after token %d", i, h, last)
		}
		last = h.Token()
		if ok, err := c.Validate(ctx, name, h.Token()); err != nil || !ok {
			t.Fatalf("validate: %v %v", ok, err)
		}
		info, err := c.Semaphore(ctx, name)
		if err != nil || info.Capacity != 3 || info.Held != 2 || len(info.Holders) != 1 || info.Holders[0].Session != s.ID() || info.Holders[0].SessionName != "go-test" {
			t.Fatalf("semaphore: %+v %v", info, err)
		}
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if !isClosed(h.Lost()) || h.Err() != nil {
			t.Fatal("a released hold's Lost is closed, with no error")
		}
		if ok, _ := c.Validate(ctx, name, h.Token()); ok {
			t.Fatal("a released token validates")
		}
	}
	// The semaphore was ephemeral: gone with its last holder.
	if _, err := c.Semaphore(ctx, name); !errors.Is(err, permit.ErrNotFound) {
		t.Fatalf("an ephemeral semaphore outlived its holders: %v", err)
	}
	if err := s.Close(ctx); err != nil || !isClosed(s.Done()) || !errors.Is(s.Err(), permit.ErrSessionLost) {
		t.Fatalf("close: %v %v", err, s.Err())
	}
	if _, err := s.Acquire(ctx, name, permit.Capacity(1)); !errors.Is(err, permit.ErrSessionLost) {
		t.Fatalf("a closed session acquired: %v", err)
	}
}

func TestErrorsCarryTheServersCodeAndStatus(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 10*time.Second)
	c := newClient(t, []string{shared.URL})
	_, err := c.Semaphore(ctx, newName(t))
	var e *permit.Error
	if !errors.As(err, &e) || e.Code != "semaphore_not_found" || e.Status != 404 || !errors.Is(err, permit.ErrNotFound) {
		t.Fatalf("%#v", err)
	}
	_, err = c.SetCapacity(ctx, "bad name!", 1)
	if !errors.As(err, &e) || e.Code != "invalid_name" || e.Status != 400 || !errors.Is(err, permit.ErrInvalidRequest) {
		t.Fatalf("%#v", err)
	}
	s := newSession(t, ctx, c)
	name := newName(t)
	if _, err := c.SetCapacity(ctx, name, 2); err != nil {
		t.Fatal(err)
	}
	_, err = s.Acquire(ctx, name, permit.Permits(3))
	if !errors.As(err, &e) || e.Code != "permits_exceed_capacity" || !errors.Is(err, permit.ErrConflict) {
		t.Fatalf("%#v", err)
	}
	if err := c.DeleteSemaphore(ctx, name); err != nil {
		t.Fatal(err)
	}
	// Nothing listens on a closed port: connection errors, retried, then ErrClusterUnavailable.
	dead := newClient(t, []string{"127.0.0.1:9"}, permit.WithTimeout(time.Second))
	_, err = dead.Semaphore(bounded(t, 300*time.Millisecond), name)
	if !errors.As(err, &e) || (e.Code != "connection" && e.Code != "deadline_exceeded") {
		t.Fatalf("%#v", err)
	}
}

func TestTryAcquireIsRefusedAtOnceAndAlreadyHeldSendsNothing(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 10*time.Second)
	c := newClient(t, []string{shared.URL})
	a, b := newSession(t, ctx, c), newSession(t, ctx, c)
	name := newName(t)
	h, err := a.TryAcquire(ctx, name, permit.Capacity(1))
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	if _, err := b.TryAcquire(ctx, name); !errors.Is(err, permit.ErrUnavailable) {
		t.Fatalf("try-acquire of a held semaphore: %v", err)
	}
	if time.Since(started) > 2*time.Second {
		t.Fatal("TryAcquire waited")
	}
	if _, err := a.Acquire(ctx, name); !errors.Is(err, permit.ErrAlreadyHeld) {
		t.Fatalf("a second guard of one hold: %v", err)
	}
	info, _ := c.Semaphore(ctx, name)
	if len(info.Waiters) != 0 || len(info.Holders) != 1 || info.Holders[0].Token != h.Token() {
		t.Fatalf("the refusals changed the semaphore: %+v", info)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	h2, err := b.TryAcquire(ctx, name, permit.Capacity(1))
	if err != nil || h2.Token() <= h.Token() {
		t.Fatalf("after the release: %v %v", h2, err)
	}
}

// Many goroutines with sessions of their own never hold more than the capacity at once, and
// every grant's token is new.
func TestCapacityIsNeverExceededByGoroutines(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 30*time.Second)
	c := newClient(t, []string{shared.URL})
	name := newName(t)
	const capacity, workers, rounds = 3, 8, 6
	if _, err := c.SetCapacity(ctx, name, capacity); err != nil {
		t.Fatal(err)
	}
	var now, peak atomic.Int64
	var mu sync.Mutex
	tokens := map[uint64]bool{}
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := c.NewSession(ctx, permit.SessionTTL(5*time.Second))
			if err != nil {
				errs <- err
				return
			}
			defer s.Close(ctx)
			for r := 0; r < rounds; r++ {
				h, err := s.Acquire(ctx, name)
				if err != nil {
					errs <- err
					return
				}
				n := now.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				mu.Lock()
				dup := tokens[h.Token()]
				tokens[h.Token()] = true
				mu.Unlock()
				if dup {
					errs <- fmt.Errorf("token %d granted twice", h.Token())
				}
				time.Sleep(time.Millisecond) // the work the permit guards
				now.Add(-1)
				if err := h.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if peak.Load() > capacity {
		t.Fatalf("%d holders at once, capacity %d", peak.Load(), capacity)
	}
	if peak.Load() < 2 || len(tokens) != workers*rounds {
		t.Fatalf("the test did not contend: peak %d, %d grants", peak.Load(), len(tokens))
	}
}

// Waiters are granted in the order they queued (strict FIFO), with growing tokens.
func TestWaitersAreGrantedInQueueOrder(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 30*time.Second)
	c := newClient(t, []string{shared.URL})
	name := newName(t)
	holder := newSession(t, ctx, c)
	first, err := holder.Acquire(ctx, name, permit.Capacity(1))
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 5
	order := make(chan int, waiters)
	tokens := make([]uint64, waiters)
	errs := make(chan error, waiters)
	var wg sync.WaitGroup
	for i := 0; i < waiters; i++ {
		s := newSession(t, ctx, c)
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			h, err := s.Acquire(ctx, name)
			if err != nil {
				errs <- err
				return
			}
			order <- i
			tokens[i] = h.Token()
			errs <- h.Release(ctx)
		}(i)
		// The next one queues only once this one is in the queue.
		if !eventually(10*time.Second, func() bool {
			info, err := c.Semaphore(ctx, name)
			return err == nil && len(info.Waiters) == i+1 && info.Waiters[i].Session == s.ID()
		}) {
			t.Fatalf("waiter %d did not queue", i)
		}
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(order)
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	want := 0
	last := first.Token()
	for i := range order {
		if i != want || tokens[i] <= last {
			t.Fatalf("grant %d went to waiter %d (token %d after %d)", want, i, tokens[i], last)
		}
		last = tokens[i]
		want++
	}
}

// A wait given up by its context leaves no waiter on the server, cancelled or timed out, and a
// grant that raced with it is released.
func TestAnEndedContextLeavesNoWaiterBehind(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 20*time.Second)
	c := newClient(t, []string{shared.URL})
	name := newName(t)
	holder, waiter := newSession(t, ctx, c), newSession(t, ctx, c)
	h, err := holder.Acquire(ctx, name, permit.Capacity(1), permit.KeepSemaphore())
	if err != nil {
		t.Fatal(err)
	}
	queued := func() bool {
		info, err := c.Semaphore(ctx, name)
		return err == nil && len(info.Waiters) == 1
	}
	// Cancelled while its long-poll is in flight.
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(wctx, name)
		done <- err
	}()
	if !eventually(10*time.Second, queued) {
		t.Fatal("the waiter did not queue")
	}
	cancel()
	err = <-done
	if !errors.Is(err, context.Canceled) || errors.Is(err, permit.ErrTimeout) {
		t.Fatalf("cancelled acquire: %v", err)
	}
	if info, _ := c.Semaphore(ctx, name); len(info.Waiters) != 0 {
		t.Fatalf("a cancelled acquire left a waiter: %+v", info.Waiters)
	}
	// Its deadline passes.
	dctx, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	defer stop()
	_, err = waiter.Acquire(dctx, name)
	if !errors.Is(err, permit.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("timed-out acquire: %v", err)
	}
	if info, _ := c.Semaphore(ctx, name); len(info.Waiters) != 0 || len(info.Holders) != 1 {
		t.Fatalf("a timed-out acquire left a waiter: %+v", info)
	}
	// The name can be waited for again, and the queue moves on.
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if h, err := waiter.Acquire(ctx, name); err != nil {
		t.Fatal(err)
	} else if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSemaphore(ctx, name); err != nil {
		t.Fatal(err)
	}
}

// A session the server no longer knows is lost at its next keepalive, within the TTL: Done and
// every hold's Lost are closed; its batch-mates live on.
func TestLostWhenTheSessionIsDeletedOnTheServer(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 20*time.Second)
	c := newClient(t, []string{shared.URL})
	const ttl = time.Second
	gone := newSession(t, ctx, c, permit.SessionTTL(ttl))
	mate := newSession(t, ctx, c, permit.SessionTTL(ttl))
	name := newName(t)
	h, err := gone.Acquire(ctx, name, permit.Capacity(2))
	if err != nil {
		t.Fatal(err)
	}
	status, body, err := raw("DELETE", shared.URL+"/v1/sessions/"+gone.ID(), "", nil)
	if err != nil || status != 204 {
		t.Fatalf("delete: %d %s %v", status, body, err)
	}
	deleted := time.Now()
	select {
	case <-h.Lost():
	case <-time.After(ttl + 500*time.Millisecond):
		t.Fatal("Lost was not closed within the TTL")
	}
	if !errors.Is(h.Err(), permit.ErrSessionLost) || !isClosed(gone.Done()) || !errors.Is(gone.Err(), permit.ErrSessionLost) {
		t.Fatalf("lost hold: %v, session: %v", h.Err(), gone.Err())
	}
	if !eventually(5*time.Second, func() bool { return mate.Deadline().After(deleted.Add(ttl)) }) || isClosed(mate.Done()) {
		t.Fatal("the other session of the client was not kept alive")
	}
	if err := h.Release(ctx); err != nil {
		t.Fatalf("releasing a lost hold: %v", err)
	}
}

// A stopped server (SIGSTOP) answers nothing: the session is presumed lost at its local
// deadline, no later than the TTL after the last acknowledged keepalive.
func TestLostWhenTheServerIsStopped(t *testing.T) {
	t.Parallel()
	node := newServer(t)
	ctx := bounded(t, 20*time.Second)
	c := newClient(t, []string{node.URL})
	const ttl = time.Second
	s := newSession(t, ctx, c, permit.SessionTTL(ttl))
	h, err := s.Acquire(ctx, newName(t), permit.Capacity(1))
	if err != nil {
		t.Fatal(err)
	}
	if err := node.signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer node.signal(syscall.SIGCONT)
	stopped := time.Now()
	select {
	case <-h.Lost():
	case <-time.After(ttl + 500*time.Millisecond):
		t.Fatal("Lost was not closed within the TTL of the stop")
	}
	if took := time.Since(stopped); took > ttl+300*time.Millisecond {
		t.Fatalf("presumed lost %v after the stop, TTL %v", took, ttl)
	}
	var e *permit.Error
	if !errors.As(h.Err(), &e) || e.Code != "session_lost" || !isClosed(s.Done()) {
		t.Fatalf("%v", h.Err())
	}
}

func TestMaxHoldClosesLost(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 10*time.Second)
	c := newClient(t, []string{shared.URL})
	s := newSession(t, ctx, c)
	name := newName(t)
	h, err := s.Acquire(ctx, name, permit.Capacity(1), permit.MaxHold(300*time.Millisecond), permit.KeepSemaphore())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.Lost():
	case <-time.After(2 * time.Second):
		t.Fatal("MaxHold passed and Lost is open")
	}
	var e *permit.Error
	if !errors.As(h.Err(), &e) || e.Code != "hold_expired" || isClosed(s.Done()) {
		t.Fatalf("%v", h.Err())
	}
	if !eventually(5*time.Second, func() bool {
		info, err := c.Semaphore(ctx, name)
		return err == nil && len(info.Holders) == 0
	}) {
		t.Fatal("the server did not release the hold")
	}
	// The name stays claimed until the lost hold is released.
	if _, err := s.TryAcquire(ctx, name); !errors.Is(err, permit.ErrAlreadyHeld) {
		t.Fatalf("an expired hold's name was free before its release: %v", err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if h2, err := s.Acquire(ctx, name); err != nil {
		t.Fatalf("acquire after the release of an expired hold: %v", err)
	} else if err := h2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestCampaignProclaimResignAndObserve(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 20*time.Second)
	c := newClient(t, []string{shared.URL})
	a, b := newSession(t, ctx, c), newSession(t, ctx, c)
	election := newName(t)
	if l, err := c.Leader(ctx, election); err != nil || l.Session != "" {
		t.Fatalf("leader before any campaign: %+v %v", l, err)
	}
	octx, stopObserving := context.WithCancel(ctx)
	leaders := c.ObserveLeader(octx, election)
	if first := <-leaders; first.Session != "" {
		t.Fatalf("first observed: %+v", first)
	}
	la, err := a.Campaign(ctx, election, "host-a")
	if err != nil {
		t.Fatal(err)
	}
	if got := <-leaders; got.Session != a.ID() || got.Value != "host-a" || got.Token != la.Token() {
		t.Fatalf("observed %+v", got)
	}
	if err := la.Proclaim(ctx, "host-a:8081"); err != nil || la.Value() != "host-a:8081" {
		t.Fatalf("proclaim: %v %q", err, la.Value())
	}
	if got := <-leaders; got.Value != "host-a:8081" || got.Token != la.Token() {
		t.Fatalf("observed after proclaim %+v", got)
	}
	bl := make(chan *permit.Leadership, 1)
	go func() {
		l, err := b.Campaign(ctx, election, "host-b")
		if err != nil {
			t.Error(err)
		}
		bl <- l
	}()
	if !eventually(10*time.Second, func() bool {
		_, body, _ := raw("GET", shared.URL+"/v1/elections/"+election, "", nil)
		var view struct {
			Candidates int `json:"candidates"`
		}
		return json.Unmarshal(body, &view) == nil && view.Candidates == 1
	}) {
		t.Fatal("b did not become a candidate")
	}
	if err := la.Resign(ctx); err != nil || !isClosed(la.Lost()) || la.Err() != nil {
		t.Fatalf("resign: %v %v", err, la.Err())
	}
	if err := la.Proclaim(ctx, "late"); !errors.Is(err, permit.ErrConflict) {
		t.Fatalf("a resigned leader proclaimed: %v", err)
	}
	lb := <-bl
	if lb == nil || lb.Token() <= la.Token() {
		t.Fatalf("b's leadership %v after %v", lb, la)
	}
	if got := <-leaders; got.Session != b.ID() || got.Value != "host-b" {
		t.Fatalf("observed %+v", got)
	}
	if l, err := c.Leader(ctx, election); err != nil || l.Session != b.ID() {
		t.Fatalf("leader: %+v %v", l, err)
	}
	stopObserving()
	if !eventually(5*time.Second, func() bool {
		_, open := <-leaders
		return !open
	}) {
		t.Fatal("ObserveLeader's channel stayed open after its context ended")
	}
	// Closing the leader's session ends its leadership.
	if err := b.Close(ctx); err != nil || !isClosed(lb.Lost()) {
		t.Fatalf("close: %v", err)
	}
	if l, _ := c.Leader(ctx, election); l.Session != "" {
		t.Fatalf("a closed session leads: %+v", l)
	}
}

// The keepalives of one client's sessions share requests: at least two renewals per request.
func TestKeepalivesOfOneClientShareRequests(t *testing.T) {
	t.Parallel()
	node := newServer(t)
	ctx := bounded(t, 20*time.Second)
	c := newClient(t, []string{node.URL})
	const sessions, ttl = 6, 900 * time.Millisecond
	var all []*permit.Session
	for i := 0; i < sessions; i++ {
		all = append(all, newSession(t, ctx, c, permit.SessionTTL(ttl)))
	}
	start := time.Now()
	if !eventually(15*time.Second, func() bool {
		for _, s := range all {
			if !s.Deadline().After(start.Add(3 * ttl)) {
				return false
			}
		}
		return true
	}) {
		t.Fatal("the sessions were not kept alive")
	}
	m := metrics(t, node.URL)
	renewals := m.sum("permit_session_keepalives_total")
	requests := m.sum("permit_http_requests_total", "keepalive")
	single := m.sum("permit_http_requests_total", "/v1/sessions/{id}/keepalive")
	if renewals < 2*sessions || single != 0 || 2*requests > renewals {
		t.Fatalf("renewals %v, keepalive requests %v (single %v)", renewals, requests, single)
	}
	for _, s := range all {
		if isClosed(s.Done()) {
			t.Fatal("a session was lost")
		}
	}
}

func TestEndpointsAreNormalizedAndChecked(t *testing.T) {
	t.Parallel()
	c, err := permit.NewClient([]string{"127.0.0.1:7376", "https://a:1,http://b:2/"})
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(c.Endpoints())
	if got != "[http://127.0.0.1:7376 https://a:1 http://b:2]" {
		t.Fatal(got)
	}
	c.Close()
	for _, bad := range []string{"ftp://x:1", "http://x:1/path", "http://u:p@x:1", " , "} {
		if _, err := permit.NewClient([]string{bad}); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}

// Closing the client ends its watches at once, and its sessions on the server.
func TestCloseEndsWatchesAndSessions(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 10*time.Second)
	c, err := permit.NewClient([]string{shared.URL})
	if err != nil {
		t.Fatal(err)
	}
	s := newSession(t, ctx, c)
	name := newName(t)
	h, err := s.Acquire(ctx, name, permit.Capacity(1))
	if err != nil {
		t.Fatal(err)
	}
	leaders := c.ObserveLeader(ctx, name)
	<-leaders
	c.Close()
	select {
	case _, open := <-leaders:
		if open {
			t.Fatal("a leader change was observed")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the watch outlived the client")
	}
	if !isClosed(s.Done()) || !isClosed(h.Lost()) {
		t.Fatal("the client's session is still open")
	}
	other := newClient(t, []string{shared.URL})
	if info, err := other.Semaphore(ctx, name); err == nil {
		t.Fatalf("the closed session's ephemeral semaphore is still there: %+v", info)
	}
	if _, err := c.NewSession(ctx); !hasClientClosed(err) {
		t.Fatalf("a closed client made a session: %v", err)
	}
}

func hasClientClosed(err error) bool {
	var e *permit.Error
	return errors.As(err, &e) && e.Code == "client_closed"
}
