package permit_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"permit.dev/go/permit"
)

func semaphoreInfo(t *testing.T, ctx context.Context, c *permit.Client, name string) *permit.SemaphoreInfo {
	t.Helper()
	info, err := c.Semaphore(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// Takes go through at once up to the burst, then a take that does not wait is rate_limited,
// with the server's retry_after_ms (exact, not the header's whole seconds); a semaphore without
// a rate takes at once, always.
func TestTakesFollowTheBurstThenRateLimitedSaysWhen(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 20*time.Second)
	c := newClient(t, []string{shared.URL})
	name := newName(t)
	// One permit every 1.5 s, 3 at once: the rate has room again long after the burst is spent.
	if _, err := c.SetCapacity(ctx, name, 1, permit.Rate(1, 1500*time.Millisecond, 3)); err != nil {
		t.Fatal(err)
	}
	var last uint64
	for i := 0; i < 3; i++ {
		token, err := c.Take(ctx, name, 1, 0)
		if err != nil || token <= last {
			t.Fatalf("take %d: token %d after %d, %v", i, token, last, err)
		}
		last = token
	}
	_, err := c.Take(ctx, name, 1, 0)
	var e *permit.Error
	if !errors.As(err, &e) || e.Code != "rate_limited" || e.Status != 429 ||
		!errors.Is(err, permit.ErrRateLimited) || !errors.Is(err, permit.ErrLimitExceeded) {
		t.Fatalf("a take beyond the burst: %#v", err)
	}
	// One more permit within 1.5 s; the Retry-After header would say 2 s.
	if e.RetryAfter <= 0 || e.RetryAfter > 1500*time.Millisecond {
		t.Fatalf("RetryAfter %v, not the server's retry_after_ms", e.RetryAfter)
	}
	if rate := semaphoreInfo(t, ctx, c, name).Rate; rate == nil || rate.Available != 0 || rate.Next <= 0 || rate.Next > 1500*time.Millisecond {
		t.Fatalf("the rate after the burst: %+v", rate)
	}
	if _, err := c.Take(ctx, name, 4, 0); !hasCode(err, "permits_exceed_capacity") || !errors.Is(err, permit.ErrConflict) {
		t.Fatalf("more permits than the burst: %v", err)
	}
	if _, err := c.Take(ctx, newName(t), 1, 0); !errors.Is(err, permit.ErrNotFound) {
		t.Fatalf("a take of a missing semaphore: %v", err)
	}
	free := newName(t)
	if _, err := c.SetCapacity(ctx, free, 1); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		if _, err := c.Take(ctx, free, 5, 0); err != nil {
			t.Fatalf("take %d of a semaphore without a rate: %v", i, err)
		}
	}
}

func hasCode(err error, code string) bool {
	var e *permit.Error
	return errors.As(err, &e) && e.Code == code
}

// A take that waits is served when the rate has room, where one that does not wait is refused.
func TestAWaitingTakeIsServedWhenTheRateAllows(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 20*time.Second)
	c := newClient(t, []string{shared.URL})
	name := newName(t)
	if _, err := c.SetCapacity(ctx, name, 1, permit.Rate(1, time.Second, 1)); err != nil {
		t.Fatal(err)
	}
	first, err := c.Take(ctx, name, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Take(ctx, name, 1, 0); !errors.Is(err, permit.ErrRateLimited) {
		t.Fatalf("a second take at once: %v", err)
	}
	start := time.Now()
	second, err := c.Take(ctx, name, 1, 10*time.Second)
	if err != nil || second <= first {
		t.Fatalf("a waiting take: token %d after %d, %v", second, first, err)
	}
	// One per second: the rate had no room for up to a second, not for several.
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("served after %v", waited)
	}
	// A wait too short for the rate ends rate_limited, with when it has room.
	if _, err := c.Take(ctx, name, 1, 0); !errors.Is(err, permit.ErrRateLimited) {
		t.Fatalf("a take at once after the waiting one: %v", err)
	}
}

// A waiting take whose context is cancelled closes its request, and the server ends the take at
// once: the semaphore's queue is empty again long before the take's wait would have run out.
func TestACancelledWaitingTakeLeavesNoWaiterBehind(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 20*time.Second)
	c := newClient(t, []string{shared.URL})
	name := newName(t)
	if _, err := c.SetCapacity(ctx, name, 1, permit.Rate(1, time.Hour, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Take(ctx, name, 1, 0); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Take(tctx, name, 1, 30*time.Second)
		done <- err
	}()
	if !eventually(5*time.Second, func() bool {
		w := semaphoreInfo(t, ctx, c, name).Waiters
		return len(w) == 1 && w[0].Take && w[0].Permits == 1 && w[0].Position == 1
	}) {
		t.Fatalf("the take does not wait: %+v", semaphoreInfo(t, ctx, c, name).Waiters)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) || !hasCode(err, "canceled") {
			t.Fatalf("a cancelled take: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Take did not return when its context was cancelled")
	}
	if !eventually(5*time.Second, func() bool { return len(semaphoreInfo(t, ctx, c, name).Waiters) == 0 }) {
		t.Fatalf("the cancelled take still waits: %+v", semaphoreInfo(t, ctx, c, name).Waiters)
	}
}

// A take whose answer is lost (a dropped connection, a 503 after the server took) is not sent
// again: it spent the rate once, and the caller hears that the outcome is unknown.
func TestATakeWhoseAnswerIsLostIsNotSentAgain(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 20*time.Second)
	var takes atomic.Int32
	proxy := newProxy(t, shared.URL, func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, "/take") {
			return false
		}
		switch takes.Add(1) {
		case 1:
			panic(http.ErrAbortHandler) // the answer is lost
		case 2:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":{"code":"no_leader","message":"the proxy says so"}}`))
			return true
		}
		return false
	})
	c := newClient(t, []string{proxy.URL})
	name := newName(t)
	if _, err := c.SetCapacity(ctx, name, 1, permit.Rate(1, time.Hour, 5)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Take(ctx, name, 1, 0); !errors.Is(err, permit.ErrClusterUnavailable) || takes.Load() != 1 {
		t.Fatalf("a take whose connection dropped: %v after %d requests", err, takes.Load())
	}
	if _, err := c.Take(ctx, name, 1, time.Second); !errors.Is(err, permit.ErrNoLeader) || takes.Load() != 2 {
		t.Fatalf("a take answered 503: %v after %d requests", err, takes.Load())
	}
	if _, err := c.Take(ctx, name, 1, 0); err != nil || takes.Load() != 3 {
		t.Fatalf("a take: %v after %d requests", err, takes.Load())
	}
	// Three takes reached the server, each once.
	if rate := semaphoreInfo(t, ctx, c, name).Rate; rate == nil || rate.Available != 2 {
		t.Fatalf("the rate after three takes of a burst of 5: %+v", rate)
	}
}

// The policies are set, kept by a SetCapacity that does not name them, and removed; a value out
// of range is refused and changes nothing.
func TestPoliciesAreSetKeptAndRemoved(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 20*time.Second)
	c := newClient(t, []string{shared.URL})
	name := newName(t)
	set, err := c.SetCapacity(ctx, name, 4, permit.Rate(10, 2*time.Second, 20), permit.LockDelay(1500*time.Millisecond), permit.GroupMax(2))
	if err != nil {
		t.Fatal(err)
	}
	want := permit.RateInfo{Permits: 10, Per: 2 * time.Second, Burst: 20, Available: 20}
	check := func(what string, info *permit.SemaphoreInfo) {
		t.Helper()
		if info.Capacity < 4 || info.Rate == nil || *info.Rate != want || info.LockDelay != 1500*time.Millisecond ||
			info.GroupMax != 2 || len(info.Delayed) != 0 || len(info.Groups) != 0 {
			t.Fatalf("%s: %+v (rate %+v)", what, info, info.Rate)
		}
	}
	check("set", set)
	check("read", semaphoreInfo(t, ctx, c, name))
	kept, err := c.SetCapacity(ctx, name, 5)
	if err != nil {
		t.Fatal(err)
	}
	check("a new capacity alone", kept)
	for _, bad := range []permit.SemaphoreOption{
		permit.LockDelay(61 * time.Second), permit.Rate(0, time.Second, 0), permit.Rate(1, 0, 0),
		permit.Rate(1, 25*time.Hour, 0), permit.GroupMax(0),
	} {
		if _, err := c.SetCapacity(ctx, name, 6, bad); !hasCode(err, "invalid_argument") || !errors.Is(err, permit.ErrInvalidRequest) {
			t.Fatalf("an out-of-range policy: %v", err)
		}
	}
	if info := semaphoreInfo(t, ctx, c, name); info.Capacity != 5 {
		t.Fatalf("a refused SetCapacity changed the capacity: %d", info.Capacity)
	} else {
		check("after the refusals", info)
	}
	// The burst defaults to the permits.
	if info, err := c.SetCapacity(ctx, name, 5, permit.Rate(3, time.Minute, 0)); err != nil || info.Rate == nil || info.Rate.Burst != 3 || info.Rate.Per != time.Minute {
		t.Fatalf("a rate without a burst: %+v %v", info, err)
	}
	cleared, err := c.SetCapacity(ctx, name, 5, permit.NoRate(), permit.LockDelay(0), permit.NoGroupMax())
	if err != nil || cleared.Rate != nil || cleared.LockDelay != 0 || cleared.GroupMax != 0 {
		t.Fatalf("removed: %+v %v", cleared, err)
	}
	if info := semaphoreInfo(t, ctx, c, name); info.Rate != nil || info.LockDelay != 0 || info.GroupMax != 0 {
		t.Fatalf("removed, read: %+v", info)
	}
}

// A revoked hold's permits stay out for the lock-delay, shown as Delayed; a waiter gets them
// when it ends, not before.
func TestARevokedHoldsPermitsAreDelayed(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 20*time.Second)
	c := newClient(t, []string{shared.URL})
	name := newName(t)
	const delay = time.Second
	if _, err := c.SetCapacity(ctx, name, 1, permit.LockDelay(delay)); err != nil {
		t.Fatal(err)
	}
	failed, other := newSession(t, ctx, c), newSession(t, ctx, c)
	if _, err := failed.Acquire(ctx, name); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	if status, body, err := raw("POST", shared.URL+"/v1/semaphores/"+name+"/revoke", "", map[string]string{"session": failed.ID()}); err != nil || status != 200 {
		t.Fatalf("revoke: %d %s %v", status, body, err)
	}
	info := semaphoreInfo(t, ctx, c, name)
	if len(info.Delayed) != 1 || info.Delayed[0].Permits != 1 || info.Delayed[0].Remaining <= 0 || info.Delayed[0].Remaining > delay ||
		info.Delayed[0].UntilMs == 0 || info.Available != 0 || info.Held != 0 {
		t.Fatalf("after the revoke: %+v", info)
	}
	if _, err := other.TryAcquire(ctx, name); !errors.Is(err, permit.ErrUnavailable) {
		t.Fatalf("a delayed permit was granted at once: %v", err)
	}
	hold, err := other.Acquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(revoked); waited < delay {
		t.Fatalf("granted %v after the revoke, before the lock-delay of %v", waited, delay)
	}
	if err := hold.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A release returns the permits at once.
	if info := semaphoreInfo(t, ctx, c, name); len(info.Delayed) != 0 || info.Available != 1 {
		t.Fatalf("after a release: %+v", info)
	}
}

// With a cap per group, a waiter whose group is at the cap is passed over, keeping its place,
// and another group's acquire is granted; the first is granted when its group drops below.
func TestAGroupAtItsCapIsPassedOver(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 20*time.Second)
	c := newClient(t, []string{shared.URL})
	name := newName(t)
	if _, err := c.SetCapacity(ctx, name, 3, permit.GroupMax(1)); err != nil {
		t.Fatal(err)
	}
	a1, a2, b := newSession(t, ctx, c), newSession(t, ctx, c), newSession(t, ctx, c)
	first, err := a1.Acquire(ctx, name, permit.Group("team-a"))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		hold *permit.Hold
		err  error
	}
	waiting := make(chan result, 1)
	go func() {
		h, err := a2.Acquire(ctx, name, permit.Group("team-a"))
		waiting <- result{h, err}
	}()
	if !eventually(5*time.Second, func() bool { return len(semaphoreInfo(t, ctx, c, name).Waiters) == 1 }) {
		t.Fatal("the second acquire of team-a does not wait")
	}
	bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	other, err := b.Acquire(bctx, name, permit.Group("team-b"))
	if err != nil {
		t.Fatalf("team-b waited behind team-a at its cap: %v", err)
	}
	info := semaphoreInfo(t, ctx, c, name)
	groups := map[string]permit.GroupInfo{}
	for _, g := range info.Groups {
		groups[g.Group] = g
	}
	if len(info.Waiters) != 1 || info.Waiters[0].Session != a2.ID() || info.Waiters[0].Group != "team-a" || info.Waiters[0].Take ||
		len(info.Holders) != 2 || info.Held != 2 || info.GroupMax != 1 ||
		groups["team-a"] != (permit.GroupInfo{Group: "team-a", Held: 1, Holders: 1, Waiters: 1}) ||
		groups["team-b"] != (permit.GroupInfo{Group: "team-b", Held: 1, Holders: 1, Waiters: 0}) {
		t.Fatalf("while team-a is at its cap: %+v", info)
	}
	for _, h := range info.Holders {
		if (h.Session == a1.ID()) != (h.Group == "team-a") || (h.Session == b.ID()) != (h.Group == "team-b") {
			t.Fatalf("holder %+v", h)
		}
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-waiting:
		if r.err != nil || r.hold.Permits() != 1 || r.hold.Token() <= other.Token() {
			t.Fatalf("the passed-over waiter: %v %v", r.hold, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("team-a's waiter was not granted when its group dropped below the cap")
	}
	if _, err := a1.Acquire(ctx, newName(t), permit.Capacity(1), permit.Group("bad group!")); !hasCode(err, "invalid_argument") {
		t.Fatalf("a bad group: %v", err)
	}
}

// A wait longer than one request's asks again (each request here waits at most 200 ms, as each
// waits at most 60 s in use) until the take is served. Not parallel: it sets the client's cap.
func TestATakeLongerThanOneRequestsWaitAsksAgainUntilServed(t *testing.T) {
	defer permit.SetTakeWaitMax(200 * time.Millisecond)()
	ctx := bounded(t, 20*time.Second)
	var takes atomic.Int32
	proxy := newProxy(t, shared.URL, func(w http.ResponseWriter, r *http.Request) bool {
		if strings.HasSuffix(r.URL.Path, "/take") {
			takes.Add(1)
		}
		return false
	})
	c := newClient(t, []string{proxy.URL})
	name := newName(t)
	if _, err := c.SetCapacity(ctx, name, 1, permit.Rate(1, 1500*time.Millisecond, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Take(ctx, name, 1, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Take(ctx, name, 1, 10*time.Second); err != nil {
		t.Fatalf("a long take: %v after %d requests", err, takes.Load())
	}
	// The first take, then the waiting one asked at least twice (the rate had room after up to
	// 1.5 s, 200 ms at a time).
	if n := takes.Load(); n < 3 {
		t.Fatalf("%d take requests", n)
	}
	// A wait that passes ends rate_limited, after asking again as long as it lasts.
	start := time.Now()
	if _, err := c.Take(ctx, name, 1, 500*time.Millisecond); !errors.Is(err, permit.ErrRateLimited) {
		t.Fatalf("a take the rate had no room for within its wait: %v", err)
	}
	if waited := time.Since(start); waited < 400*time.Millisecond {
		t.Fatalf("rate_limited after %v of a 500 ms wait", waited)
	}
}
