// Package permit is the Go client of Permit, the distributed semaphore service: fair (strict
// FIFO), weighted, fenced, replicated semaphores, locks, leader elections and work queues over
// HTTP.
// It uses the standard library only.
//
// A Client talks to one server or the nodes of a cluster. A Session is the client's liveness
// on the server, kept alive in the background; its holds end with it:
//
//	client, err := permit.NewClient([]string{"http://10.0.0.1:7376", "http://10.0.0.2:7376"})
//	session, err := client.NewSession(ctx, permit.SessionTTL(10*time.Second))
//	defer session.Close(ctx)
//	hold, err := session.Acquire(ctx, "db.orders", permit.Permits(2), permit.Capacity(8))
//	defer hold.Release(ctx)
//	write(hold.Token()) // the fencing token travels with every write it guards
//
// Every call that can block or do I/O takes a context first. Acquire and Campaign wait their
// turn in FIFO order; the server pushes the grant (long-polls, no polling), and when the
// context ends the queue place is given up on the server before the call returns.
//
// # Queues
//
// Client.Push appends items to a durable queue; Session.Claim waits for them (pushed, FIFO
// among claimers) and returns each as an Item, a lease of the session with a fencing token:
// Ack it when the work is done, Nack it to hand it back. When the session ends, its claimed
// items are pending again at once for the other workers:
//
//	client.Push(ctx, "emails", email{To: "ada@example.com"}, permit.Key("welcome-ada"))
//	items, err := session.Claim(ctx, "emails", permit.Max(10))
//	for _, item := range items {
//		var e email
//		item.Payload(&e)
//		send(e, item.Token())
//		item.Ack(ctx)
//	}
//
// # Rate limits, lock-delay and groups
//
// SetCapacity's options give a semaphore policies beside its capacity: a Rate that the grants
// of acquires and takes also obey (decided on the leader's clock), a LockDelay that keeps the
// permits of a failed holder out of circulation for a while, and a GroupMax per acquire Group,
// so that one group's backlog never starves the others. Client.Take is the pure rate limiter:
// no session, holds nothing; with no room it fails with ErrRateLimited, and Error.RetryAfter
// says when the rate has room:
//
//	client.SetCapacity(ctx, "llm-api", 4, permit.Rate(10, time.Second, 10), permit.GroupMax(2))
//	if _, err := client.Take(ctx, "llm-api", 1, 5*time.Second); errors.Is(err, permit.ErrRateLimited) {
//		// no room within 5 s
//	}
//	hold, err := session.Acquire(ctx, "llm-api", permit.Group("team-a"))
//
// # Lease loss
//
// The session's goroutine sends a keepalive every TTL/3; the keepalives of all sessions of one
// Client share batched requests. The session keeps a conservative local deadline, the send
// time of the last acknowledged keepalive plus the TTL: the server keeps the session at least
// that long. When that deadline passes, or the server says the session is gone, the session is
// lost: Session.Done is closed, and the Lost channel of every Hold, Leadership and Item it had
// (Hold.Lost is also closed when its MaxHold passes). Stop touching the protected resource
// then; a write that still arrives carries an old token, which Client.Validate refuses.
//
// # Failover and retries
//
// Requests go to the endpoint that answered last or that a successful answer named as the
// leader. On connection errors and 503s they move to the next endpoint; idempotent calls are
// retried with jittered, bounded backoff for a few seconds, which rides out a leader election;
// a session creation is sent again only when it certainly did not reach a leader. A waiting
// Acquire or Campaign keeps its queue place through an outage while its session lives.
//
// # Errors
//
// Every failed call returns an *Error with the server's Code, Status and Message (errors.As).
// The sentinels (ErrUnavailable, ErrSessionLost, ErrNotFound, ErrPermissionDenied, ErrTimeout,
// ErrNoLeader, ...) tell programs what kind of failure it was (errors.Is); an ended context's
// error also unwraps to context.Canceled or context.DeadlineExceeded.
package permit
