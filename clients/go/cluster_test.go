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

// A 3-node cluster: the leader is killed (-9) while a session holds a claimed item and another
// session's claim is blocked. The claim survives with its token (the ack works after the
// failover), and the blocked claim, failed over, is answered by a push to the new leader.
func TestAClaimSurvivesALeaderKill(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	leader := cl.leader(5 * time.Second)
	if leader < 0 {
		t.Fatal("no leader")
	}
	if !cl.speaks(leader, 4, 10*time.Second) {
		t.Fatal("the cluster does not speak feature version 4 (queues)")
	}
	urls := cl.urls()
	urls[0], urls[leader] = urls[leader], urls[0]
	ctx := bounded(t, 60*time.Second)
	c := newClient(t, urls)
	const ttl = 5 * time.Second
	worker := newSession(t, ctx, c, permit.SessionTTL(ttl))
	waiter := newSession(t, ctx, c, permit.SessionTTL(ttl))
	queue := newName(t)
	if _, err := c.Push(ctx, queue, "first"); err != nil {
		t.Fatal(err)
	}
	items, err := worker.Claim(ctx, queue)
	if err != nil || len(items) != 1 {
		t.Fatalf("claim: %v %v", items, err)
	}
	item := items[0]
	type claimed struct {
		items []*permit.Item
		err   error
	}
	blocked := make(chan claimed, 1)
	go func() {
		items, err := waiter.Claim(ctx, queue)
		blocked <- claimed{items, err}
	}()
	if !eventually(10*time.Second, func() bool {
		info, err := c.Queue(ctx, queue)
		return err == nil && info.Claimers == 1
	}) {
		t.Fatal("the second claim did not block")
	}
	killed := time.Now()
	cl.nodes[leader].kill()
	if next := cl.leader(15 * time.Second); next < 0 || next == leader {
		t.Fatalf("no new leader: %d", next)
	}
	if !eventually(15*time.Second, func() bool { return worker.Deadline().After(killed.Add(ttl)) }) {
		t.Fatal("the worker's session was not kept alive across the failover")
	}
	if isClosed(item.Lost()) {
		t.Fatalf("the claim was lost: %v", item.Err())
	}
	info, err := c.Queue(ctx, queue)
	if err != nil || info.Claimed != 1 || info.Claimers != 1 {
		t.Fatalf("after the failover: %+v %v", info, err)
	}
	if err := item.Ack(ctx); err != nil {
		t.Fatalf("ack with the claim's token after the failover: %v", err)
	}
	if _, err := c.Push(ctx, queue, "second"); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-blocked:
		var payload string
		if r.err != nil || len(r.items) != 1 || r.items[0].Payload(&payload) != nil || payload != "second" ||
			r.items[0].Token() <= item.Token() {
			t.Fatalf("the blocked claim: %v %v", r.items, r.err)
		}
		if err := r.items[0].Ack(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the blocked claim was not answered after the push")
	}
	if info, err := c.Queue(ctx, queue); err != nil || info.Pending+info.Claimed+info.Delayed != 0 {
		t.Fatalf("at the end: %+v %v", info, err)
	}
}
