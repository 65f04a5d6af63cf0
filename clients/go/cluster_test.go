package permit_test

import (
	"testing"
	"time"

	"permit.dev/go/permit"
)

// A 3-node cluster: the leader is killed (-9) during a hold while another goroutine waits for
// it. The hold keeps its token (its keepalives move to the new leader), the waiter's
// long-poll fails over, and it gets the next grant, with a larger token.
func TestLeaderKillDuringAHoldWhileAnotherWaits(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	leader := cl.leader(5 * time.Second)
	if leader < 0 {
		t.Fatal("no leader")
	}
	// The leader first, so that the client starts there and must move on after the kill.
	urls := cl.urls()
	urls[0], urls[leader] = urls[leader], urls[0]
	ctx := bounded(t, 60*time.Second)
	c := newClient(t, urls)
	const ttl = 5 * time.Second
	holder := newSession(t, ctx, c, permit.SessionTTL(ttl))
	waiter := newSession(t, ctx, c, permit.SessionTTL(ttl))
	name := newName(t)
	h, err := holder.Acquire(ctx, name, permit.Capacity(1))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		h   *permit.Hold
		err error
	}
	granted := make(chan result, 1)
	go func() {
		h, err := waiter.Acquire(ctx, name)
		granted <- result{h, err}
	}()
	if !eventually(10*time.Second, func() bool {
		info, err := c.Semaphore(ctx, name)
		return err == nil && len(info.Waiters) == 1
	}) {
		t.Fatal("the waiter did not queue")
	}
	killed := time.Now()
	cl.nodes[leader].kill()
	if next := cl.leader(15 * time.Second); next < 0 || next == leader {
		t.Fatalf("no new leader: %d", next)
	}
	// A keepalive sent after the kill is acknowledged by the new leader.
	if !eventually(15*time.Second, func() bool { return holder.Deadline().After(killed.Add(ttl)) }) {
		t.Fatal("the holder's session was not kept alive across the failover")
	}
	if isClosed(h.Lost()) || isClosed(holder.Done()) {
		t.Fatalf("the hold was lost: %v", h.Err())
	}
	if ok, err := c.Validate(ctx, name, h.Token()); err != nil || !ok {
		t.Fatalf("validate after the failover: %v %v", ok, err)
	}
	info, err := c.Semaphore(ctx, name)
	if err != nil || len(info.Holders) != 1 || info.Holders[0].Token != h.Token() || len(info.Waiters) != 1 {
		t.Fatalf("after the failover: %+v %v", info, err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-granted:
		if r.err != nil || r.h.Token() <= h.Token() || isClosed(r.h.Lost()) {
			t.Fatalf("the waiter: %v %v", r.h, r.err)
		}
		if err := r.h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter was not granted after the release")
	}
}
