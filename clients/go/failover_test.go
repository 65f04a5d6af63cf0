package permit_test

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"permit.dev/go/permit"
)

// A refused connection certainly sent nothing: every call, a session creation too, moves on
// to the next endpoint.
func TestARefusingEndpointIsSkipped(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 10*time.Second)
	c := newClient(t, []string{"127.0.0.1:9", shared.URL})
	s := newSession(t, ctx, c)
	h, err := s.Acquire(ctx, newName(t), permit.Capacity(1))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A request that timed out may have been applied: an idempotent read moves on to the next
// endpoint, a session creation is not sent again (it could make a second session).
func TestATimedOutSessionCreationIsNotResent(t *testing.T) {
	t.Parallel()
	stopped := newServer(t)
	if err := stopped.signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer stopped.signal(syscall.SIGCONT)
	ctx := bounded(t, 20*time.Second)
	name := newName(t)
	if _, err := newClient(t, []string{shared.URL}).SetCapacity(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	// The stopped node's kernel accepts the connection; nothing answers.
	c := newClient(t, []string{stopped.URL, shared.URL}, permit.WithTimeout(300*time.Millisecond))
	started := time.Now()
	_, err := c.NewSession(ctx)
	var e *permit.Error
	if !errors.As(err, &e) || e.Code != "connection" || !errors.Is(err, permit.ErrClusterUnavailable) {
		t.Fatalf("a session creation that timed out: %v", err)
	}
	if took := time.Since(started); took > 2*time.Second {
		t.Fatalf("the creation took %v: it was retried", took)
	}
	read := newClient(t, []string{stopped.URL, shared.URL}, permit.WithTimeout(300*time.Millisecond))
	if info, err := read.Semaphore(ctx, name); err != nil || info.Capacity != 1 {
		t.Fatalf("an idempotent read did not move on: %+v %v", info, err)
	}
}
