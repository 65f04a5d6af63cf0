package permit

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// keepaliveBatchMax is the most session ids in one batched keepalive
	// (permit_wire::KEEPALIVE_BATCH_MAX).
	keepaliveBatchMax = 1024
	// batchRouteRetry is how long keepalives go one per session after the server answered
	// the batch route 404/405, before the route is tried again (the cluster may have been
	// upgraded meanwhile).
	batchRouteRetry = time.Minute
	// rideWait is the longest a departing batch waits for the sessions it woke to join it.
	rideWait = 5 * time.Millisecond
)

// renewal is an acknowledged keepalive: when the request carrying it was sent, and the TTL the
// server renewed the session for.
type renewal struct {
	sent time.Time
	ttl  time.Duration
}

// ask is one session's ask to be kept alive by the next batch.
type ask struct {
	id          string
	timeout     time.Duration
	done        chan struct{} // closed once settled
	renewal     renewal
	err         error
	unsupported bool        // the server has no batch route: the session goes alone
	abandoned   atomic.Bool // the session stopped waiting for it: not sent
}

func (a *ask) settle(r renewal, err error, unsupported bool) {
	a.renewal, a.err, a.unsupported = r, err, unsupported
	close(a.done)
}

// batcher is the group commit of one client's keepalives: an ask is sent at once when no
// batch is in flight; asks that come while one is in flight all go in the next request
// (POST /v1/sessions/keepalive, up to keepaliveBatchMax ids) when it returns. Healthy
// sessions past half their keepalive period ride along: they are woken when a batch departs,
// so that the sessions of one client fall into step and share their requests. A server
// without the batch route (404/405) gets one request per session for batchRouteRetry.
type batcher struct {
	client *Client

	mu             sync.Mutex
	asks           []*ask
	sending        bool // a sender goroutine runs; it takes every ask queued before it stops
	unbatchedUntil time.Time
	riders         map[*Session]struct{}
	joined         int
	joinedSignal   chan struct{}
}

func newBatcher(c *Client) *batcher {
	return &batcher{client: c, riders: map[*Session]struct{}{}, joinedSignal: make(chan struct{}, 1)}
}

func (b *batcher) unbatched() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return time.Now().Before(b.unbatchedUntil)
}

func (b *batcher) ride(s *Session) {
	b.mu.Lock()
	b.riders[s] = struct{}{}
	b.mu.Unlock()
}

func (b *batcher) unride(s *Session) {
	b.mu.Lock()
	delete(b.riders, s)
	b.mu.Unlock()
}

// keepalive keeps s alive through the next batch (or alone, on an older server); timeout
// bounds the request, wait the wait for its answer.
func (b *batcher) keepalive(s *Session, timeout, wait time.Duration) (renewal, error) {
	if !b.unbatched() {
		a := &ask{id: s.id, timeout: timeout, done: make(chan struct{})}
		b.mu.Lock()
		b.asks = append(b.asks, a)
		b.joined++
		start := !b.sending
		b.sending = true
		b.mu.Unlock()
		select {
		case b.joinedSignal <- struct{}{}:
		default:
		}
		if start {
			go b.send()
		}
		timer := time.NewTimer(wait)
		defer timer.Stop()
		select {
		case <-a.done:
		case <-timer.C:
		case <-s.stop:
		}
		select {
		case <-a.done:
		default:
			a.abandoned.Store(true)
			return renewal{}, newError("timeout", 0, "the batched keepalive was not answered in time")
		}
		if !a.unsupported {
			return a.renewal, a.err
		}
	}
	ctx, cancel := context.WithTimeout(s.life, timeout)
	defer cancel()
	sent := time.Now()
	got, err := b.client.do(ctx, call{method: "POST", path: "/v1/sessions/" + s.id + "/keepalive", policy: onePass, timeout: timeout})
	if err != nil {
		return renewal{}, err
	}
	var out struct {
		TTLMs uint64 `json:"ttl_ms"`
	}
	if err := got.decode(&out); err != nil {
		return renewal{}, err
	}
	return renewal{sent, time.Duration(out.TTLMs) * time.Millisecond}, nil
}

// send is the sender goroutine: one batch after another while asks keep coming.
func (b *batcher) send() {
	for {
		b.waitRiders(b.depart())
		asks := b.take()
		if asks == nil {
			return
		}
		if b.unbatched() {
			for _, a := range asks {
				a.settle(renewal{}, nil, true)
			}
			continue
		}
		seen := map[string]bool{}
		var ids []string
		timeout := asks[0].timeout
		for _, a := range asks {
			if !seen[a.id] {
				seen[a.id] = true
				ids = append(ids, a.id)
			}
			timeout = minDuration(timeout, a.timeout)
		}
		// Taken before the request leaves: every renewal it carries happens after it.
		sent := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		got, err := b.client.do(ctx, call{method: "POST", path: "/v1/sessions/keepalive", body: map[string][]string{"sessions": ids}, policy: onePass, timeout: timeout})
		cancel()
		b.settle(asks, ids, sent, got, err)
	}
}

// depart wakes the riders as a batch is about to be taken; it returns how many to wait for.
func (b *batcher) depart() int {
	b.mu.Lock()
	riders := make([]*Session, 0, len(b.riders))
	for s := range b.riders {
		riders = append(riders, s)
	}
	b.riders = map[*Session]struct{}{}
	b.joined = 0
	b.mu.Unlock()
	for _, s := range riders {
		s.onDeparture()
	}
	return len(riders)
}

// waitRiders lets the count sessions a departing batch woke join it (at most rideWait).
func (b *batcher) waitRiders(count int) {
	if count == 0 {
		return
	}
	timer := time.NewTimer(rideWait)
	defer timer.Stop()
	for {
		b.mu.Lock()
		joined := b.joined
		b.mu.Unlock()
		if joined >= count {
			return
		}
		select {
		case <-b.joinedSignal:
		case <-timer.C:
			return
		}
	}
}

// take returns the next batch's asks, or nil (and the sender stops) when none is left.
func (b *batcher) take() []*ask {
	b.mu.Lock()
	defer b.mu.Unlock()
	live := b.asks[:0]
	for _, a := range b.asks {
		if !a.abandoned.Load() {
			live = append(live, a)
		}
	}
	b.asks = live
	if len(b.asks) == 0 {
		b.asks = nil
		b.sending = false
		return nil
	}
	n := len(b.asks)
	if n > keepaliveBatchMax {
		n = keepaliveBatchMax
	}
	asks := append([]*ask(nil), b.asks[:n]...)
	b.asks = append([]*ask(nil), b.asks[n:]...)
	return asks
}

// settle hands each ask its session's result.
func (b *batcher) settle(asks []*ask, ids []string, sent time.Time, got answer, err error) {
	var results map[string]keepaliveResult
	if err == nil {
		results, err = keepaliveResults(ids, got)
	}
	if err != nil {
		lacks := lacksBatchRoute(err)
		if lacks {
			b.mu.Lock()
			b.unbatchedUntil = time.Now().Add(batchRouteRetry)
			b.mu.Unlock()
		}
		for _, a := range asks {
			a.settle(renewal{}, err, lacks)
		}
		return
	}
	for _, a := range asks {
		r := results[a.id]
		if r.err != nil {
			a.settle(renewal{}, r.err, false)
		} else {
			a.settle(renewal{sent, r.ttl}, nil, false)
		}
	}
}

type keepaliveResult struct {
	ttl time.Duration
	err *Error
}

// itemStatus is the HTTP status of each error a batched keepalive can answer for one session.
var itemStatus = map[string]int{"session_not_found": 404, "permission_denied": 403}

func keepaliveResults(ids []string, got answer) (map[string]keepaliveResult, error) {
	var body struct {
		Sessions []struct {
			ID    string  `json:"id"`
			TTLMs *uint64 `json:"ttl_ms"`
			Error *struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		} `json:"sessions"`
	}
	if err := got.decode(&body); err != nil {
		return nil, err
	}
	if len(body.Sessions) != len(ids) {
		return nil, newError("protocol", got.status, "the batched keepalive's results do not match the ids sent")
	}
	out := make(map[string]keepaliveResult, len(ids))
	for i, r := range body.Sessions {
		switch {
		case r.ID != ids[i]:
			return nil, newError("protocol", got.status, "the batched keepalive's results do not match the ids sent")
		case r.TTLMs != nil:
			out[r.ID] = keepaliveResult{ttl: time.Duration(*r.TTLMs) * time.Millisecond}
		case r.Error != nil:
			status := itemStatus[r.Error.Code]
			if status == 0 {
				status = got.status
			}
			out[r.ID] = keepaliveResult{err: &Error{Code: r.Error.Code, Status: status, Message: r.Error.Message}}
		default:
			return nil, newError("protocol", got.status, "a batched keepalive result with neither ttl_ms nor error")
		}
	}
	return out, nil
}

// lacksBatchRoute reports whether err is an older server's answer to the batch route it does
// not have: 405 (the path matched /v1/sessions/{id}) or a 404 other than session_not_found.
func lacksBatchRoute(err error) bool {
	e, ok := err.(*Error)
	return ok && (e.Status == 405 || (e.Status == 404 && e.Code != "session_not_found"))
}
