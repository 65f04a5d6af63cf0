package permit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"permit.dev/go/permit"
)

// queueInfo reads queue name, failing the test on an error.
func queueInfo(t *testing.T, ctx context.Context, c *permit.Client, name string) *permit.QueueInfo {
	t.Helper()
	info, err := c.Queue(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func claimOne(t *testing.T, ctx context.Context, s *permit.Session, queue string, opts ...permit.ClaimOption) *permit.Item {
	t.Helper()
	items, err := s.Claim(ctx, queue, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 1 {
		t.Fatalf("claimed %d items, not 1", len(items))
	}
	return items[0]
}

type job struct {
	N int `json:"n"`
}

// Items are claimed in seq order with growing tokens; an ack settles once; a nack puts the item
// back in its seq place with its reason; another session's token, or a claim an admin ended,
// gets claim_lost and changes nothing.
func TestItemsAreClaimedInOrderAckedOnceAndNackedBackIntoTheirPlace(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 20*time.Second)
	c := newClient(t, []string{shared.URL})
	a, b := newSession(t, ctx, c), newSession(t, ctx, c)
	queue := newName(t)
	pushed, err := c.PushMany(ctx, queue, []permit.PushItem{{Payload: job{1}}, {Payload: job{2}}, {Payload: json.RawMessage(`[3]`)}})
	if err != nil {
		t.Fatal(err)
	}
	if len(pushed) != 3 || !(pushed[0].Seq < pushed[1].Seq && pushed[1].Seq < pushed[2].Seq) {
		t.Fatalf("pushed: %+v", pushed)
	}
	first, err := a.Claim(ctx, queue, permit.Max(2))
	if err != nil || len(first) != 2 {
		t.Fatalf("claim: %v %v", first, err)
	}
	var j0, j1 job
	if first[0].Payload(&j0) != nil || first[1].Payload(&j1) != nil || j0.N != 1 || j1.N != 2 {
		t.Fatalf("payloads %s %s", first[0].RawPayload(), first[1].RawPayload())
	}
	if first[0].ID() != pushed[0].ID || first[0].Seq() != pushed[0].Seq || first[0].Attempt() != 1 ||
		first[0].Queue() != queue || !(first[0].Token() < first[1].Token()) {
		t.Fatalf("claimed %v %v, pushed %+v", first[0], first[1], pushed)
	}
	if info := queueInfo(t, ctx, c, queue); info.Pending != 1 || info.Claimed != 2 {
		t.Fatalf("after the claim: %+v", info)
	}

	// b's session with a's token: claim_lost, and a's claim is intact.
	status, body, err := raw("POST", shared.URL+"/v1/queues/"+queue+"/items/"+first[0].ID()+"/ack", "",
		map[string]any{"session": b.ID(), "token": first[0].Token()})
	if err != nil || status != 409 || !strings.Contains(string(body), "claim_lost") {
		t.Fatalf("another session's ack: %d %s %v", status, body, err)
	}
	if err := first[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if !isClosed(first[0].Lost()) || first[0].Err() != nil {
		t.Fatalf("an acked item: lost %v, err %v", isClosed(first[0].Lost()), first[0].Err())
	}
	if err := first[0].Ack(ctx); !errors.Is(err, permit.ErrClaimLost) {
		t.Fatalf("a second ack: %v", err)
	}

	// A nack puts the item back ahead of the third one, with its reason.
	if err := first[1].Nack(ctx, permit.Reason("flaky")); err != nil {
		t.Fatal(err)
	}
	again := claimOne(t, ctx, b, queue)
	if again.ID() != first[1].ID() || again.Attempt() != 2 || again.Token() <= first[1].Token() {
		t.Fatalf("after the nack: %v (was %v)", again, first[1])
	}
	status, body, err = raw("GET", shared.URL+"/v1/queues/"+queue+"/items?state=claimed", "", nil)
	if err != nil || status != 200 || !strings.Contains(string(body), `"last_error":"flaky"`) {
		t.Fatalf("the nack's reason: %d %s %v", status, body, err)
	}

	// An admin removes the claimed item: the server refuses the ack with claim_lost, which
	// ends the claim here too.
	status, body, err = raw("DELETE", shared.URL+"/v1/queues/"+queue+"/items/"+again.ID(), "", nil)
	if err != nil || status != 204 {
		t.Fatalf("remove: %d %s %v", status, body, err)
	}
	err = again.Ack(ctx)
	var e *permit.Error
	if !errors.Is(err, permit.ErrClaimLost) || !errors.As(err, &e) || e.Status != 409 {
		t.Fatalf("ack of a removed item: %v", err)
	}
	if !isClosed(again.Lost()) || !errors.Is(again.Err(), permit.ErrClaimLost) {
		t.Fatalf("the lost claim: %v", again.Err())
	}
	// A nack with a delay keeps the last item out of claims.
	last := claimOne(t, ctx, a, queue)
	if err := last.Nack(ctx, permit.Delay(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if items, err := b.TryClaim(ctx, queue); err != nil || len(items) != 0 {
		t.Fatalf("claimed a delayed item: %v %v", items, err)
	}
	if info := queueInfo(t, ctx, c, queue); info.Delayed != 1 || info.Pending != 0 || info.Claimed != 0 {
		t.Fatalf("at the end: %+v", info)
	}
}

// Blocked claims are served first come first served, the moment an item is pushed.
func TestBlockedClaimsAreAnsweredInOrderTheMomentAnItemIsPushed(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 20*time.Second)
	c := newClient(t, []string{shared.URL})
	queue := newName(t)
	if _, err := c.PutQueue(ctx, queue, permit.QueueSettings{}); err != nil {
		t.Fatal(err)
	}
	type claimed struct {
		item *permit.Item
		err  error
	}
	var results []chan claimed
	for i := 0; i < 2; i++ {
		s := newSession(t, ctx, c)
		got := make(chan claimed, 1)
		go func() {
			items, err := s.Claim(ctx, queue)
			if err == nil && len(items) != 1 {
				err = errors.New("not one item")
			}
			var item *permit.Item
			if err == nil {
				item = items[0]
			}
			got <- claimed{item, err}
		}()
		results = append(results, got)
		// The next one blocks only once this one does.
		if !eventually(10*time.Second, func() bool { return queueInfo(t, ctx, c, queue).Claimers == uint64(i+1) }) {
			t.Fatalf("claim %d did not block", i)
		}
	}
	for i, want := range []string{"one", "two"} {
		pushed := time.Now()
		if _, err := c.Push(ctx, queue, want); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-results[i]:
			var payload string
			if r.err != nil || r.item.Payload(&payload) != nil || payload != want {
				t.Fatalf("claim %d: %v %v %q", i, r.item, r.err, payload)
			}
			if took := time.Since(pushed); took > 3*time.Second {
				t.Fatalf("answered %v after the push: polled, not pushed", took)
			}
			if err := r.item.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("claim %d was not answered after the push", i)
		}
		if i == 0 && len(results[1]) != 0 {
			t.Fatal("the second claim was answered before the first")
		}
	}
}

// A claim whose context ends leaves no blocked claim on the server: a later push stays pending.
func TestAnEndedContextLeavesNoBlockedClaimBehind(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 20*time.Second)
	c := newClient(t, []string{shared.URL})
	s := newSession(t, ctx, c)
	queue := newName(t)
	if _, err := c.PutQueue(ctx, queue, permit.QueueSettings{}); err != nil {
		t.Fatal(err)
	}
	// Cancelled while its long-poll is in flight.
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := s.Claim(cctx, queue)
		done <- err
	}()
	if !eventually(10*time.Second, func() bool { return queueInfo(t, ctx, c, queue).Claimers == 1 }) {
		t.Fatal("the claim did not block")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) || errors.Is(err, permit.ErrTimeout) {
		t.Fatalf("cancelled claim: %v", err)
	}
	if info := queueInfo(t, ctx, c, queue); info.Claimers != 0 {
		t.Fatalf("a cancelled claim left a blocked claim: %+v", info)
	}
	// Its deadline passes.
	dctx, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	defer stop()
	if _, err := s.Claim(dctx, queue); !errors.Is(err, permit.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("timed-out claim: %v", err)
	}
	if info := queueInfo(t, ctx, c, queue); info.Claimers != 0 {
		t.Fatalf("a timed-out claim left a blocked claim: %+v", info)
	}
	if _, err := c.Push(ctx, queue, "nobody's"); err != nil {
		t.Fatal(err)
	}
	if info := queueInfo(t, ctx, c, queue); info.Pending != 1 || info.Claimed != 0 {
		t.Fatalf("a given-up claim took the item: %+v", info)
	}
}

// A session the server no longer knows is lost within its TTL: each claimed item's Lost is
// closed, and the item is pending again for another session's claim.
func TestALostSessionClosesItsItemsLostAndTheyArePendingAgain(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 20*time.Second)
	c := newClient(t, []string{shared.URL})
	const ttl = time.Second
	gone, other := newSession(t, ctx, c, permit.SessionTTL(ttl)), newSession(t, ctx, c)
	queue := newName(t)
	if _, err := c.Push(ctx, queue, job{7}); err != nil {
		t.Fatal(err)
	}
	item := claimOne(t, ctx, gone, queue)
	status, body, err := raw("DELETE", shared.URL+"/v1/sessions/"+gone.ID(), "", nil)
	if err != nil || status != 204 {
		t.Fatalf("delete: %d %s %v", status, body, err)
	}
	select {
	case <-item.Lost():
	case <-time.After(ttl + 500*time.Millisecond):
		t.Fatal("Lost was not closed within the TTL")
	}
	if !errors.Is(item.Err(), permit.ErrSessionLost) {
		t.Fatalf("lost item: %v", item.Err())
	}
	if info := queueInfo(t, ctx, c, queue); info.Pending != 1 || info.Claimed != 0 {
		t.Fatalf("the lost session's item: %+v", info)
	}
	again := claimOne(t, ctx, other, queue)
	if again.ID() != item.ID() || again.Attempt() != 2 || again.Token() <= item.Token() {
		t.Fatalf("claimed again: %v (was %v)", again, item)
	}
	if err := item.Ack(ctx); !errors.Is(err, permit.ErrClaimLost) {
		t.Fatalf("ack of a lost claim: %v", err)
	}
	if err := again.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// newProxy forwards requests to target and relays the answers, except those intercept handles:
// it sees each answer first, and may write another (returning true) or drop the connection
// (panic(http.ErrAbortHandler)).
func newProxy(t *testing.T, target string, intercept func(w http.ResponseWriter, r *http.Request) bool) *httptest.Server {
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req, err := http.NewRequest(r.Method, target+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		req.Header = r.Header.Clone()
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		defer resp.Body.Close()
		answer, _ := io.ReadAll(resp.Body)
		if intercept(w, r) {
			return
		}
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		w.Write(answer)
	}))
	t.Cleanup(proxy.Close)
	return proxy
}

// lossyProxy answers the first claim it forwards with a dropped connection and the third with
// a 503, and the first ack with a dropped connection, after the server did them.
func lossyProxy(t *testing.T, target string) (*httptest.Server, *atomic.Int32) {
	var claims, acks atomic.Int32
	proxy := newProxy(t, target, func(w http.ResponseWriter, r *http.Request) bool {
		if strings.HasSuffix(r.URL.Path, "/claim") {
			switch claims.Add(1) {
			case 1:
				panic(http.ErrAbortHandler) // the answer is lost
			case 3:
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusServiceUnavailable)
				w.Write([]byte(`{"error":{"code":"no_leader","message":"the proxy says so"}}`))
				return true
			}
		}
		if strings.HasSuffix(r.URL.Path, "/ack") && acks.Add(1) == 1 {
			panic(http.ErrAbortHandler)
		}
		return false
	})
	return proxy, &claims
}

// A claim whose answer is lost (a dropped connection, a 503) is sent again with the same
// request_id: it answers the items the first one took, and never takes more. An ack whose
// answer is lost is sent again; the repeat's claim_lost says the item may have been acked.
func TestARetriedClaimAnswersTheSameItemsAndTakesNoMore(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 20*time.Second)
	proxy, claims := lossyProxy(t, shared.URL)
	c := newClient(t, []string{proxy.URL})
	s := newSession(t, ctx, c)
	queue := newName(t)
	var all []permit.PushItem
	for n := 1; n <= 5; n++ {
		all = append(all, permit.PushItem{Payload: job{n}})
	}
	if _, err := c.PushMany(ctx, queue, all); err != nil {
		t.Fatal(err)
	}
	// Lost answer, then the retry: the first two items.
	items, err := s.Claim(ctx, queue, permit.Max(2))
	if err != nil || len(items) != 2 || claims.Load() != 2 {
		t.Fatalf("claim: %v %v after %d claim requests", items, err, claims.Load())
	}
	// A 503, then the retry: the next two.
	more, err := s.Claim(ctx, queue, permit.Max(2))
	if err != nil || len(more) != 2 || claims.Load() != 4 {
		t.Fatalf("claim: %v %v after %d claim requests", more, err, claims.Load())
	}
	for i, it := range append(items, more...) {
		var j job
		if it.Payload(&j) != nil || j.N != i+1 {
			t.Fatalf("item %d is %s", i, it.RawPayload())
		}
	}
	if info := queueInfo(t, ctx, c, queue); info.Claimed != 4 || info.Pending != 1 {
		t.Fatalf("a retried claim took more than asked: %+v", info)
	}
	for i, it := range append(items, more...) {
		err := it.Ack(ctx)
		if i == 0 {
			// The proxy lost the first ack's answer.
			if !errors.Is(err, permit.ErrClaimLost) || !strings.Contains(err.Error(), "may have acked") ||
				!errors.Is(it.Err(), permit.ErrClaimLost) || !isClosed(it.Lost()) {
				t.Fatalf("ack after a lost answer: %v (%v)", err, it.Err())
			}
		} else if err != nil || it.Err() != nil || !isClosed(it.Lost()) {
			t.Fatalf("ack of %v: %v (%v)", it, err, it.Err())
		}
	}
	if info := queueInfo(t, ctx, c, queue); info.Claimed != 0 || info.Pending != 1 {
		t.Fatalf("after the acks: %+v", info)
	}
}

// Deduplication keys, delayed pushes, and the queue's settings, listing and deletion.
func TestKeysDelaysAndQueueAdmin(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 20*time.Second)
	c := newClient(t, []string{shared.URL})
	s := newSession(t, ctx, c)
	queue := newName(t)
	info, err := c.PutQueue(ctx, queue, permit.QueueSettings{MaxAttempts: 1, DeadLetter: queue + ".failed", MaxItems: 10})
	if err != nil || info.MaxAttempts != 1 || info.DeadLetter != queue+".failed" || info.MaxItems != 10 || info.Name != queue {
		t.Fatalf("put: %+v %v", info, err)
	}
	first, err := c.Push(ctx, queue, "a", permit.Key("k1"))
	if err != nil || first.Duplicate {
		t.Fatalf("push: %+v %v", first, err)
	}
	dup, err := c.Push(ctx, queue, "b", permit.Key("k1"))
	if err != nil || !dup.Duplicate || dup.ID != first.ID {
		t.Fatalf("a push with the same key: %+v %v", dup, err)
	}
	later, err := c.Push(ctx, queue, "later", permit.Delay(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if info := queueInfo(t, ctx, c, queue); info.Pending != 1 || info.Delayed != 1 || info.OldestPending < 0 {
		t.Fatalf("%+v", info)
	}
	listed, err := c.Queues(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, q := range listed {
		found = found || q.Name == queue
	}
	if !found {
		t.Fatalf("%s is not among %d queues", queue, len(listed))
	}
	if err := c.DeleteQueue(ctx, queue); !errors.Is(err, permit.ErrConflict) {
		t.Fatalf("deleting a busy queue: %v", err)
	}
	// max_attempts 1: the first nack moves the item to the dead-letter queue, reason kept.
	item := claimOne(t, ctx, s, queue)
	if err := item.Nack(ctx, permit.Reason("broken")); err != nil {
		t.Fatal(err)
	}
	dead := claimOne(t, ctx, s, queue+".failed")
	var payload string
	if dead.Payload(&payload) != nil || payload != "a" {
		t.Fatalf("dead-lettered: %s", dead.RawPayload())
	}
	if err := dead.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	status, body, err := raw("DELETE", shared.URL+"/v1/queues/"+queue+"/items/"+later.ID, "", nil)
	if err != nil || status != 204 {
		t.Fatalf("remove: %d %s %v", status, body, err)
	}
	if err := c.DeleteQueue(ctx, queue); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Queue(ctx, queue); !errors.Is(err, permit.ErrNotFound) {
		t.Fatalf("a deleted queue: %v", err)
	}
}

// A claim whose context ends after the server handed it an item, before the answer arrived:
// the give-up finds the item and nacks it back, so that no claim holds it unseen.
func TestItemsThatRacedWithAGivenUpClaimAreNackedBack(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 20*time.Second)
	answered := make(chan struct{})
	var claims atomic.Int32
	proxy := newProxy(t, shared.URL, func(w http.ResponseWriter, r *http.Request) bool {
		if strings.HasSuffix(r.URL.Path, "/claim") && claims.Add(1) == 1 {
			close(answered)
			<-r.Context().Done() // held until the client gives up
			panic(http.ErrAbortHandler)
		}
		return false
	})
	c := newClient(t, []string{proxy.URL})
	s := newSession(t, ctx, c)
	queue := newName(t)
	if _, err := c.PutQueue(ctx, queue, permit.QueueSettings{}); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := s.Claim(cctx, queue)
		done <- err
	}()
	if !eventually(10*time.Second, func() bool { return queueInfo(t, ctx, c, queue).Claimers == 1 }) {
		t.Fatal("the claim did not block")
	}
	if _, err := c.Push(ctx, queue, "raced"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not answer the claim")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled claim: %v", err)
	}
	if info := queueInfo(t, ctx, c, queue); info.Claimed != 0 || info.Pending != 1 || info.Claimers != 0 {
		t.Fatalf("after the give-up: %+v", info)
	}
	status, body, err := raw("GET", shared.URL+"/v1/queues/"+queue+"/items?state=pending", "", nil)
	if err != nil || status != 200 || !strings.Contains(string(body), "given up") {
		t.Fatalf("the raced item: %d %s %v", status, body, err)
	}
}

// countingProxy forwards to upstream and counts the claim and ack requests that pass.
func countingProxy(t *testing.T, upstream string) (*httptest.Server, *atomic.Int64, *atomic.Int64) {
	t.Helper()
	target, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	forward := httputil.NewSingleHostReverseProxy(target)
	var claims, acks atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/claim"):
			claims.Add(1)
		case strings.HasSuffix(r.URL.Path, "/ack"):
			acks.Add(1)
		}
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	return proxy, &claims, &acks
}

// AckAndClaim acks an item and claims the next in one request per item; a blocked one is
// answered by the next push while its ack stands; when ctx ends the ack stands and the claim
// is given up on the server.
func TestAckAndClaimAcksAndClaimsTheNextItemInOneRequest(t *testing.T) {
	t.Parallel()
	ctx := bounded(t, 20*time.Second)
	proxy, claims, acks := countingProxy(t, shared.URL)
	c := newClient(t, []string{proxy.URL})
	s := newSession(t, ctx, c)
	queue := newName(t)
	pushed, err := c.PushMany(ctx, queue, []permit.PushItem{{Payload: job{1}}, {Payload: job{2}}, {Payload: job{3}}})
	if err != nil {
		t.Fatal(err)
	}
	item := claimOne(t, ctx, s, queue)
	for i, p := range pushed {
		var j job
		if item.ID() != p.ID || item.Payload(&j) != nil || j.N != i+1 {
			t.Fatalf("item %d is %v (%s), pushed %s", i, item, item.RawPayload(), p.ID)
		}
		if i == len(pushed)-1 {
			break
		}
		next, err := item.AckAndClaim(ctx)
		if err != nil || item.Err() != nil || !isClosed(item.Lost()) {
			t.Fatalf("ack and claim of %v: %v (%v)", item, err, item.Err())
		}
		item = next
	}
	if claims.Load() != 1 || acks.Load() != 2 {
		t.Fatalf("%d claim and %d ack requests for 3 items, not 1 and 2", claims.Load(), acks.Load())
	}
	// The last one's claim waits: answered by the next push; the ack stands meanwhile.
	type claimed struct {
		item *permit.Item
		err  error
	}
	done := make(chan claimed, 1)
	go func() {
		next, err := item.AckAndClaim(ctx)
		done <- claimed{next, err}
	}()
	if !eventually(10*time.Second, func() bool { return queueInfo(t, ctx, c, queue).Claimers == 1 }) {
		t.Fatal("the claim did not block")
	}
	if info := queueInfo(t, ctx, c, queue); info.Claimed != 0 || info.Pending != 0 {
		t.Fatalf("not acked while its claim waits: %+v", info)
	}
	later, err := c.Push(ctx, queue, job{4})
	if err != nil {
		t.Fatal(err)
	}
	got := <-done
	if got.err != nil || got.item.ID() != later.ID {
		t.Fatalf("the blocked ack and claim: %v %v, pushed %s", got.item, got.err, later.ID)
	}
	// ctx ends with nothing pushed: the ack stands, the claim is given up.
	dctx, stop := context.WithTimeout(ctx, 300*time.Millisecond)
	defer stop()
	if _, err := got.item.AckAndClaim(dctx); !errors.Is(err, permit.ErrTimeout) {
		t.Fatalf("an ack and claim whose ctx ended: %v", err)
	}
	if info := queueInfo(t, ctx, c, queue); info.Claimed != 0 || info.Pending != 0 || info.Claimers != 0 {
		t.Fatalf("after an ack and claim whose ctx ended: %+v", info)
	}
	if err := got.item.Ack(ctx); !errors.Is(err, permit.ErrClaimLost) {
		t.Fatalf("a second ack: %v", err)
	}
}
