package permit_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	"permit.dev/go/permit"
)

// The examples run against the server that PERMIT_SERVER names (NewClient(nil) reads it, as the
// permit CLI does); the tests set it to a server of their own.

func ExampleNewClient() {
	// Every node of the cluster; requests move to the next one on connection errors and 503s.
	client, err := permit.NewClient([]string{os.Getenv("PERMIT_SERVER")}, permit.WithTimeout(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	fmt.Println(len(client.Endpoints()))
	// Output: 1
}

func ExampleWithAuthToken() {
	// A server started with --auth needs a token (PERMIT_AUTH_TOKEN is read when none is given).
	client, err := permit.NewClient(nil, permit.WithAuthToken(os.Getenv("PERMIT_AUTH_TOKEN")))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
}

func ExampleWithCAFile() {
	// Trust a private CA for https:// endpoints, and present a client certificate to a server
	// started with --tls-client-ca.
	client, err := permit.NewClient([]string{"https://permit.internal:7376"},
		permit.WithCAFile("/etc/permit/ca.pem"),
		permit.WithClientCert("/etc/permit/client.pem", "/etc/permit/client.key"))
	if err != nil {
		fmt.Println("no certificates here:", errors.Is(err, os.ErrNotExist))
		return
	}
	defer client.Close()
	// Output: no certificates here: true
}

func ExampleWithClientCert() {
	_, err := permit.NewClient([]string{"https://permit.internal:7376"},
		permit.WithClientCert("client.pem", "client.key"))
	fmt.Println(err != nil)
	// Output: true
}

func ExampleWithTimeout() {
	// Each request that does not wait in a queue gets at most 2 s (waits are bounded by their
	// context).
	client, err := permit.NewClient(nil, permit.WithTimeout(2*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
}

func ExampleWithHTTPClient() {
	// Requests go through this http.Client's transport (proxies, tracing, custom TLS).
	client, err := permit.NewClient(nil, permit.WithHTTPClient(&http.Client{Transport: http.DefaultTransport}))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	info, err := client.SetCapacity(context.Background(), "example-http-client", 2)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(info.Capacity)
	// Output: 2
}

func ExampleClient_NewSession() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	// Kept alive every TTL/3 in the background; lost (Done closed) when no keepalive is
	// acknowledged for a TTL.
	session, err := client.NewSession(ctx, permit.SessionTTL(10*time.Second), permit.SessionName("worker-1"))
	if err != nil {
		log.Fatal(err)
	}
	defer session.Close(ctx)
	fmt.Println(len(session.ID()), session.TTL())
	// Output: 32 10s
}

func ExampleClient_Close() {
	client, _ := permit.NewClient(nil)
	session, _ := client.NewSession(context.Background())
	// Closes the client's open sessions on the server too: their holds are freed at once.
	client.Close()
	<-session.Done()
	fmt.Println(errors.Is(session.Err(), permit.ErrSessionLost))
	// Output: true
}

func ExampleSession_Acquire() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	session, _ := client.NewSession(ctx)
	defer session.Close(ctx)

	// Wait at most a minute for 2 of the 8 permits of "gpu" (created on the fly).
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	hold, err := session.Acquire(wctx, "example-gpu", permit.Permits(2), permit.Capacity(8))
	if errors.Is(err, permit.ErrTimeout) {
		log.Fatal("still busy after a minute; not queued any more")
	} else if err != nil {
		log.Fatal(err)
	}
	defer hold.Release(ctx)
	fmt.Println(hold.Permits(), hold.Token() > 0)
	// Output: 2 true
}

func ExampleSession_TryAcquire() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	a, _ := client.NewSession(ctx)
	defer a.Close(ctx)
	b, _ := client.NewSession(ctx)
	defer b.Close(ctx)

	hold, _ := a.TryAcquire(ctx, "example-lock", permit.Capacity(1))
	defer hold.Release(ctx)
	_, err := b.TryAcquire(ctx, "example-lock")
	fmt.Println(errors.Is(err, permit.ErrUnavailable))
	// Output: true
}

func ExampleSession_Done() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	session, _ := client.NewSession(ctx, permit.SessionTTL(time.Second))

	work, stop := context.WithCancel(ctx)
	go func() {
		// Closed when the session is lost (or closed): stop what its holds protected.
		<-session.Done()
		stop()
	}()
	session.Close(ctx)
	<-work.Done()
	var e *permit.Error
	errors.As(session.Err(), &e)
	fmt.Println(e.Code, errors.Is(e, permit.ErrSessionLost))
	// Output: session_closed true
}

func ExampleHold_Lost() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	session, _ := client.NewSession(ctx)
	defer session.Close(ctx)

	// The server releases the hold after MaxHold; Lost is closed then (and when the session is
	// lost). Stop touching the protected resource when it is.
	hold, _ := session.Acquire(ctx, "example-batch", permit.Capacity(1), permit.MaxHold(200*time.Millisecond))
	select {
	case <-hold.Lost():
		var e *permit.Error
		errors.As(hold.Err(), &e)
		fmt.Println(e.Code)
	case <-time.After(10 * time.Second):
		fmt.Println("still held")
	}
	hold.Release(ctx)
	// Output: hold_expired
}

func ExampleHold_Release() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	session, _ := client.NewSession(ctx)
	defer session.Close(ctx)

	hold, err := session.Acquire(ctx, "example-release", permit.Capacity(1))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(hold.Release(ctx), hold.Release(ctx)) // idempotent
	// Output: <nil> <nil>
}

func ExampleSession_Campaign() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	session, _ := client.NewSession(ctx)
	defer session.Close(ctx)

	// Blocks until this session leads.
	leadership, err := session.Campaign(ctx, "example-scheduler", "host-a:8080")
	if err != nil {
		log.Fatal(err)
	}
	defer leadership.Resign(ctx)
	leader, _ := client.Leader(ctx, "example-scheduler")
	fmt.Println(leader.Value, leader.Token == leadership.Token())
	// Output: host-a:8080 true
}

func ExampleLeadership_Lost() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	session, _ := client.NewSession(ctx)
	leadership, _ := session.Campaign(ctx, "example-lost", "host-a")
	go session.Close(ctx) // elsewhere: the session ends, and the leadership with it
	<-leadership.Lost()
	fmt.Println("no longer leading")
	// Output: no longer leading
}

func ExampleLeadership_Proclaim() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	session, _ := client.NewSession(ctx)
	defer session.Close(ctx)

	leadership, _ := session.Campaign(ctx, "example-proclaim", "host-a:8080")
	defer leadership.Resign(ctx)
	// A new value, the same leadership and token.
	if err := leadership.Proclaim(ctx, "host-a:8081"); err != nil {
		log.Fatal(err)
	}
	leader, _ := client.Leader(ctx, "example-proclaim")
	fmt.Println(leader.Value, leadership.Value())
	// Output: host-a:8081 host-a:8081
}

func ExampleLeadership_Resign() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	session, _ := client.NewSession(ctx)
	defer session.Close(ctx)

	leadership, _ := session.Campaign(ctx, "example-resign", "host-a")
	leadership.Resign(ctx)
	leader, _ := client.Leader(ctx, "example-resign")
	fmt.Println(leader.Session == "")
	// Output: true
}

func ExampleClient_Leader() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	leader, err := client.Leader(ctx, "example-nobody")
	if err != nil {
		log.Fatal(err)
	}
	if leader.Session == "" {
		fmt.Println("nobody leads")
	}
	// Output: nobody leads
}

func ExampleClient_ObserveLeader() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	session, _ := client.NewSession(ctx)
	defer session.Close(context.Background())

	leaders := client.ObserveLeader(ctx, "example-observed") // pushed, not polled
	fmt.Printf("%q\n", (<-leaders).Value)
	leadership, _ := session.Campaign(ctx, "example-observed", "host-b")
	defer leadership.Resign(context.Background())
	fmt.Printf("%q\n", (<-leaders).Value)
	// Output:
	// ""
	// "host-b"
}

func ExampleClient_SetCapacity() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	info, err := client.SetCapacity(ctx, "example-db", 8)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(info.Capacity, info.Available)
	// Output: 8 8
}

func ExampleClient_Semaphore() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	session, _ := client.NewSession(ctx)
	defer session.Close(ctx)
	hold, _ := session.Acquire(ctx, "example-read", permit.Capacity(4), permit.Permits(3))
	defer hold.Release(ctx)

	info, err := client.Semaphore(ctx, "example-read")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(info.Capacity, info.Held, info.Available, len(info.Holders), len(info.Waiters))
	// Output: 4 3 1 1 0
}

func ExampleClient_DeleteSemaphore() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	client.SetCapacity(ctx, "example-delete", 1)
	fmt.Println(client.DeleteSemaphore(ctx, "example-delete"))
	_, err := client.Semaphore(ctx, "example-delete")
	fmt.Println(errors.Is(err, permit.ErrNotFound))
	// Output:
	// <nil>
	// true
}

func ExampleClient_Validate() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	session, _ := client.NewSession(ctx)
	defer session.Close(ctx)
	hold, _ := session.Acquire(ctx, "example-fence", permit.Capacity(1))

	// What the protected resource asks before it accepts a write carrying the token.
	ok, _ := client.Validate(ctx, "example-fence", hold.Token())
	fmt.Println(ok)
	hold.Release(ctx)
	ok, _ = client.Validate(ctx, "example-fence", hold.Token())
	fmt.Println(ok)
	// Output:
	// true
	// false
}

func ExampleError() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	_, err := client.SetCapacity(ctx, "bad name!", 1)
	var e *permit.Error
	if errors.As(err, &e) {
		fmt.Println(e.Code, e.Status, errors.Is(err, permit.ErrInvalidRequest))
	}
	// Output: invalid_name 400 true
}

func ExampleSession_Close() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	session, _ := client.NewSession(ctx)
	hold, _ := session.Acquire(ctx, "example-close", permit.Capacity(1), permit.KeepSemaphore())

	// Frees everything the session holds, at once (not after its TTL).
	if err := session.Close(ctx); err != nil {
		log.Fatal(err)
	}
	info, _ := client.Semaphore(ctx, "example-close")
	fmt.Println(len(info.Holders), isClosedChan(hold.Lost()))
	// Output: 0 true
}

func ExampleSession_Deadline() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	session, _ := client.NewSession(ctx, permit.SessionTTL(10*time.Second))
	defer session.Close(ctx)
	// How long the holds are safe without another acknowledged keepalive.
	left := time.Until(session.Deadline())
	fmt.Println(left > 9*time.Second && left <= 10*time.Second)
	// Output: true
}

func ExampleHold_Token() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	session, _ := client.NewSession(ctx)
	defer session.Close(ctx)

	// Each grant's token is larger than every one before: a resource that remembers the largest
	// it saw refuses a late write of an older holder.
	first, _ := session.Acquire(ctx, "example-token", permit.Capacity(1))
	first.Release(ctx)
	second, _ := session.Acquire(ctx, "example-token", permit.Capacity(1))
	defer second.Release(ctx)
	fmt.Println(second.Token() > first.Token())
	// Output: true
}

func ExampleMaxHold() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	session, _ := client.NewSession(ctx)
	defer session.Close(ctx)

	// Two permits of a semaphore of 4 kept after its last user leaves, released by the server
	// after a minute even if this process hangs with its session alive.
	hold, err := session.Acquire(ctx, "example-options",
		permit.Permits(2), permit.Capacity(4), permit.KeepSemaphore(), permit.MaxHold(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	hold.Release(ctx)
	info, _ := client.Semaphore(ctx, "example-options")
	fmt.Println(info.Capacity, info.Held)
	// Output: 4 0
}

func isClosedChan(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
