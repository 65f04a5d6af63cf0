package permit

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"net/url"
	"time"
)

// queues is the wait table's entry of a queue's claim. A blocked claim is given up by its
// request_id (POST .../claim/cancel): the server ends it and answers the items it took before
// that (see giveUpClaim).
var queues = &object{collection: "queues", noun: "queue", wait: "claim", end: "claim"}

// claimRequestIDMax is the largest request_id of a claim (2^53 - 1: exact in every JSON reader).
const claimRequestIDMax = 1<<53 - 1

// PushOption configures a Push: Delay or Key.
type PushOption interface{ applyPush(*PushItem) }

// NackOption configures a Nack: Delay or Reason.
type NackOption interface{ applyNack(*nackConfig) }

// ClaimOption configures a Claim: Max.
type ClaimOption func(*claimConfig)

type nackConfig struct {
	delay  time.Duration
	reason string
}

type claimConfig struct {
	max int
}

// DelayOption keeps an item out of claims for a while: after a Push, or after a Nack. See
// Delay.
type DelayOption struct{ d time.Duration }

func (o DelayOption) applyPush(i *PushItem)   { i.Delay = o.d }
func (o DelayOption) applyNack(c *nackConfig) { c.delay = o.d }

// Delay keeps the pushed or nacked item out of claims for d (at most 7 days; default 0).
func Delay(d time.Duration) DelayOption { return DelayOption{d} }

type keyOption string

func (k keyOption) applyPush(i *PushItem) { i.Key = string(k) }

// Key is a deduplication key (1 to 128 bytes): while an item pushed with it is pending,
// delayed or claimed, a push with the same key adds nothing and answers that item
// (Pushed.Duplicate).
func Key(key string) PushOption { return keyOption(key) }

type reasonOption string

func (r reasonOption) applyNack(c *nackConfig) { c.reason = string(r) }

// Reason says why the work failed (at most 1024 bytes); the server keeps it with the item as
// its last_error, also in the dead-letter queue.
func Reason(why string) NackOption { return reasonOption(why) }

// Max claims up to n items at once (1 to 1000; default 1).
func Max(n int) ClaimOption { return func(c *claimConfig) { c.max = n } }

// PushItem is one item of a PushMany.
type PushItem struct {
	Payload any           // encoded with encoding/json (a json.RawMessage is sent as is); at most 64 KiB
	Delay   time.Duration // keeps the item out of claims for this long
	Key     string        // deduplication key; "" for none
}

// Pushed is a pushed item as the server answered it.
type Pushed struct {
	ID  string `json:"id"`  // the item's id (opaque)
	Seq uint64 `json:"seq"` // its place in the queue: grows strictly within a queue
	// Duplicate: the push added nothing, an item with the same Key is pending, delayed or
	// claimed, and this is that item.
	Duplicate bool `json:"duplicate"`
}

type pushItemBody struct {
	Payload json.RawMessage `json:"payload"`
	DelayMs uint64          `json:"delay_ms,omitempty"`
	Key     string          `json:"key,omitempty"`
}

func (i PushItem) body() (pushItemBody, error) {
	payload, err := json.Marshal(i.Payload)
	if err != nil {
		return pushItemBody{}, fmt.Errorf("permit: encoding the payload: %w", err)
	}
	return pushItemBody{Payload: payload, DelayMs: ms(i.Delay), Key: i.Key}, nil
}

// Push appends one item to queue (creating the queue with the defaults if it does not exist)
// and returns its id and place. payload is any value encoding/json encodes (a json.RawMessage
// is sent as is), at most 64 KiB encoded (else code payload_too_large).
//
// A push with a Key is retried like any idempotent call: the key makes a repeat add nothing.
// One without is sent again only when it certainly did not reach a leader, so that the client
// never pushes an item twice; after an ambiguous failure, push again with a Key if duplicates
// matter.
func (c *Client) Push(ctx context.Context, queue string, payload any, opts ...PushOption) (Pushed, error) {
	item := PushItem{Payload: payload}
	for _, opt := range opts {
		opt.applyPush(&item)
	}
	body, err := item.body()
	if err != nil {
		return Pushed{}, err
	}
	pushed, err := c.push(ctx, queue, body, item.Key != "")
	if err != nil {
		return Pushed{}, err
	}
	if len(pushed) != 1 {
		return Pushed{}, newError("protocol", 0, "a push of one item answered %d", len(pushed))
	}
	return pushed[0], nil
}

// PushMany appends items to queue in order (1 to 1000), all or nothing, in one log entry, and
// returns them as the server answered, in the same order. It is retried as Push is: like an
// idempotent call when every item has a Key.
func (c *Client) PushMany(ctx context.Context, queue string, items []PushItem) ([]Pushed, error) {
	bodies := make([]pushItemBody, 0, len(items))
	keyed := len(items) > 0
	for _, item := range items {
		body, err := item.body()
		if err != nil {
			return nil, err
		}
		bodies = append(bodies, body)
		keyed = keyed && item.Key != ""
	}
	return c.push(ctx, queue, map[string]any{"items": bodies}, keyed)
}

func (c *Client) push(ctx context.Context, queue string, body any, keyed bool) ([]Pushed, error) {
	p := unsent
	if keyed {
		p = idempotent
	}
	var out struct {
		Items []Pushed `json:"items"`
	}
	if err := c.get(ctx, call{method: "POST", path: "/v1/queues/" + segment(queue) + "/items", body: body, policy: p}, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}

// Claim waits until items of queue are due and claims up to Max of them (default 1), in seq
// order, for this session. Blocked claims are served in the order they came, and the server
// pushes the items the moment they arrive (long-polls of at most 30 s or the TTL; nothing
// polls). Each returned Item is a lease of this session: Ack it when the work is done, Nack it
// to hand it back; if the session ends first, the item is pending again for another claim.
//
// Each claim carries a random request_id: a claim sent again after a connection error or a
// 503 answers the items the first one took, never more. When ctx ends the blocked claim is
// given up on the server before Claim returns (items that raced with it are nacked back), and
// the error unwraps to ctx's error (it matches ErrTimeout when the deadline passed). While the
// cluster is unreachable the claim asks again until the session's local deadline. A queue that
// does not exist is ErrNotFound (code queue_not_found): Push and PutQueue create queues, a
// claim does not.
func (s *Session) Claim(ctx context.Context, queue string, opts ...ClaimOption) ([]*Item, error) {
	return s.claimItems(ctx, queue, false, opts)
}

// TryClaim claims up to Max due items of queue (default 1) without waiting: none (an empty
// slice, no error) when nothing is due.
func (s *Session) TryClaim(ctx context.Context, queue string, opts ...ClaimOption) ([]*Item, error) {
	return s.claimItems(ctx, queue, true, opts)
}

type claimBody struct {
	Session   string `json:"session"`
	Max       int    `json:"max"`
	WaitMs    uint64 `json:"wait_ms"`
	RequestID uint64 `json:"request_id"`
}

// nextClaimBody is the claim an ack makes for the same session (AckAndClaim).
type nextClaimBody struct {
	Max       int    `json:"max"`
	WaitMs    uint64 `json:"wait_ms"`
	RequestID uint64 `json:"request_id"`
}

type cancelClaimBody struct {
	Session   string `json:"session"`
	RequestID uint64 `json:"request_id"`
}

type claimedItem struct {
	ID      string          `json:"id"`
	Seq     uint64          `json:"seq"`
	Payload json.RawMessage `json:"payload"`
	Attempt int             `json:"attempt"`
	Token   uint64          `json:"token"`
}

type claimAnswer struct {
	Items []claimedItem `json:"items"`
}

// newRequestID is a claim's random request_id, in 1..2^53-1: from crypto/rand, since
// math/rand's global source starts from the same seed in every process before Go 1.20.
func newRequestID() uint64 {
	var b [8]byte
	if _, err := cryptorand.Read(b[:]); err != nil {
		return 1 + uint64(rand.Int63n(claimRequestIDMax))
	}
	return 1 + binary.LittleEndian.Uint64(b[:])%claimRequestIDMax
}

func (s *Session) claimItems(ctx context.Context, queue string, tryOnce bool, opts []ClaimOption) ([]*Item, error) {
	cfg := claimConfig{max: 1}
	for _, opt := range opts {
		opt(&cfg)
	}
	if err := s.check(); err != nil {
		return nil, err
	}
	path := queues.path(queue, queues.wait)
	// The long-polls end when the session is lost, not only when ctx does.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-wctx.Done():
		}
	}()
	request := newRequestID()
	pause := outagePauseMin
	for {
		wait := s.waitSlice(ctx, tryOnce)
		body := claimBody{Session: s.id, Max: cfg.max, WaitMs: ms(wait), RequestID: request}
		got, err := s.client.do(wctx, call{method: "POST", path: path, body: body, timeout: maxDuration(s.client.timeout, wait+longPollMargin)})
		if err != nil {
			switch {
			case s.Err() != nil:
				// Lost (or closed) meanwhile: its claims ended with it.
				return nil, s.Err()
			case ctx.Err() != nil:
				s.giveUpClaim(queue, request)
				return nil, contextError(ctx, "claiming from queue "+queue)
			case hasCode(err, "session_not_found"):
				s.lose(err.(*Error))
				return nil, err
			case errors.Is(err, ErrClusterUnavailable) && !tryOnce && !hasCode(err, "tls"):
				// An outage: what the claim took meanwhile stays claimed while the session
				// lives, so ask again with the same request_id (answered with those items, or
				// waiting on) until the session's local deadline or ctx ends.
				if sleep(wctx, pause) != nil {
					continue // the next turn returns the reason
				}
				pause = minDuration(pause*2, outagePauseMax)
				continue
			default:
				return nil, err
			}
		}
		pause = outagePauseMin
		var answer claimAnswer
		if err := got.decode(&answer); err != nil {
			return nil, err
		}
		if len(answer.Items) > 0 || tryOnce {
			return s.adoptItems(queue, answer.Items), nil
		}
		// Nothing came within the wait: the server ended the claim. The next one is new.
		if err := s.check(); err != nil {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, contextError(ctx, "claiming from queue "+queue)
		}
		request = newRequestID()
	}
}

// adoptItems makes guards of claimed items.
func (s *Session) adoptItems(queue string, claimed []claimedItem) []*Item {
	items := make([]*Item, 0, len(claimed))
	for _, c := range claimed {
		it := &Item{guard: newGuard(s, queues, queue, c.Token), id: c.ID, seq: c.Seq, attempt: c.Attempt, payload: c.Payload}
		s.adopt(&it.guard)
		items = append(items, it)
	}
	return items
}

// giveUpClaim ends the blocked claim request on the server, bounded by the client's timeout
// whatever ctx did: POST .../claim/cancel, which ends it without taking anything and answers
// the items it took before that; those are nacked back at once, so that nobody's claim holds
// them.
func (s *Session) giveUpClaim(queue string, request uint64) {
	if s.Err() != nil {
		return // the server ended the claim with the session
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.client.timeout)
	defer cancel()
	body := cancelClaimBody{Session: s.id, RequestID: request}
	got, err := s.client.do(ctx, call{method: "POST", path: queues.path(queue, "claim/cancel"), body: body})
	if err != nil {
		if e, ok := err.(*Error); ok && e.Code == "session_not_found" {
			s.lose(e)
		}
		return
	}
	var answer claimAnswer
	if got.decode(&answer) != nil {
		return
	}
	for _, it := range s.adoptItems(queue, answer.Items) {
		_ = it.Nack(ctx, Reason("the claim was given up: its context ended"))
	}
}

// Item is a queue item claimed by a session: a lease that lasts until it is acked or nacked,
// or the session ends (then the item is pending again for another claim).
type Item struct {
	guard
	id      string
	seq     uint64
	attempt int
	payload json.RawMessage
}

// ID is the item's id (opaque; unique in the cluster).
func (it *Item) ID() string { return it.id }

// Queue is the name of the item's queue.
func (it *Item) Queue() string { return it.name }

// Seq is the item's place in its queue: claims hand items out in seq order.
func (it *Item) Seq() uint64 { return it.seq }

// Attempt counts the claims of this item, this one included: 1 on the first claim. An item
// claimed the queue's max_attempts times without an ack moves to its dead-letter queue.
func (it *Item) Attempt() int { return it.attempt }

// Token is the claim's fencing token, from the counter of semaphore grants: larger than every
// token issued before. A sink that keeps the largest token it saw refuses a stale worker's late
// write.
func (it *Item) Token() uint64 { return it.token }

// Payload decodes the payload into v, as json.Unmarshal does.
func (it *Item) Payload(v any) error { return json.Unmarshal(it.payload, v) }

// RawPayload is the payload as pushed (a copy).
func (it *Item) RawPayload() json.RawMessage { return append(json.RawMessage(nil), it.payload...) }

// Lost is closed when the claim ends: its session was lost or closed (Err matches
// ErrSessionLost), the server refused an Ack or Nack because the claim was over (Err matches
// ErrClaimLost), or it was acked or nacked (Err is nil). Stop the work when it is closed: the
// item is someone else's to do.
func (it *Item) Lost() <-chan struct{} { return it.lost }

// Err is nil while the claim lasts and after an Ack or Nack; the reason once it was lost.
func (it *Item) Err() error { return it.errNow() }

// Ack settles the item as done: it is gone for good. ErrClaimLost when the claim ended first
// (nothing changed: the item is, or will be, claimed again). An ack whose answer was lost is
// sent again, and the repeat meets claim_lost when the first attempt did ack the item: after
// a lost answer, ErrClaimLost means maybe acked (its message says so). Either way the item is
// no longer this worker's; a sink that checks tokens applies no work twice.
func (it *Item) Ack(ctx context.Context) error {
	return it.settle(ctx, "ack", map[string]any{})
}

// AckAndClaim acks the item and claims the session's next item of the same queue in the same
// request (one round trip and one log entry instead of two), then waits for one as Claim does
// while ctx lasts. The ack and the claim are applied together or not at all: an error that
// leaves the item unacked is Ack's (ErrClaimLost, ...), and the item is still this worker's.
// Once applied the ack stands: an error after it (ctx ended: ErrTimeout at its deadline; the
// session lost) is Claim's, and the item is settled. On a cluster older than feature version 6
// it acks, then claims, in two requests. A worker's loop:
//
//	item := first
//	for {
//		work(item)
//		next, err := item.AckAndClaim(ctx)
//		if err != nil {
//			return err
//		}
//		item = next
//	}
func (it *Item) AckAndClaim(ctx context.Context) (*Item, error) {
	s := it.session
	wait := s.waitSlice(ctx, false)
	request := newRequestID()
	body := map[string]any{"claim": nextClaimBody{Max: 1, WaitMs: ms(wait), RequestID: request}}
	got, err := it.settleAnswer(ctx, "ack", body, maxDuration(s.client.timeout, wait+longPollMargin))
	switch {
	case hasCode(err, "feature_unavailable"):
		if err := it.Ack(ctx); err != nil {
			return nil, err
		}
	case err != nil:
		// Unanswered (ctx ended, or no node answered), the ack may have applied and its claim
		// may wait: end the claim on the server. An answer is the last word.
		if ctx.Err() != nil {
			s.giveUpClaim(it.name, request)
			return nil, contextError(ctx, "acking and claiming from queue "+it.name)
		}
		if errors.Is(err, ErrClusterUnavailable) {
			s.giveUpClaim(it.name, request)
		}
		return nil, err
	default:
		var answer claimAnswer
		if err := got.decode(&answer); err != nil {
			return nil, err
		}
		if len(answer.Items) > 0 {
			return s.adoptItems(it.name, answer.Items)[0], nil
		}
	}
	// Acked; nothing came within the first wait: claim as Claim does for the rest of ctx.
	items, err := s.Claim(ctx, it.name)
	if err != nil {
		return nil, err
	}
	return items[0], nil
}

// Nack hands the item back: it is pending again in its seq place (after Delay), or moves to
// the dead-letter queue when it was claimed max_attempts times; Reason is kept with it.
// ErrClaimLost when the claim ended first (after a lost answer: maybe nacked, as for Ack).
func (it *Item) Nack(ctx context.Context, opts ...NackOption) error {
	var cfg nackConfig
	for _, opt := range opts {
		opt.applyNack(&cfg)
	}
	extra := map[string]any{}
	if cfg.delay > 0 {
		extra["delay_ms"] = ms(cfg.delay)
	}
	if cfg.reason != "" {
		extra["error"] = cfg.reason
	}
	return it.settle(ctx, "nack", extra)
}

// settle acks or nacks the claim: once; and only on the server while the claim may last.
func (it *Item) settle(ctx context.Context, verb string, body map[string]any) error {
	_, err := it.settleAnswer(ctx, verb, body, 0)
	return err
}

// settleAnswer is settle with the server's answer, and the call's timeout (0: the client's).
func (it *Item) settleAnswer(ctx context.Context, verb string, body map[string]any, timeout time.Duration) (answer, error) {
	it.mu.Lock()
	released, ended, lostErr := it.released, it.ended, it.err
	it.mu.Unlock()
	switch {
	case released:
		return answer{}, newError("claim_lost", 0, "item %s of queue %s: already acked or nacked", it.id, it.name)
	case ended:
		why := it.session.Err() // closed with its session
		if lostErr != nil {
			why = lostErr
		}
		return answer{}, newError("claim_lost", 0, "item %s of queue %s: the claim ended: %v", it.id, it.name, why)
	}
	s := it.session
	body["session"] = s.id
	body["token"] = it.token
	var resent bool
	path := queues.path(it.name, "items/"+segment(it.id)+"/"+verb)
	got, err := s.client.do(ctx, call{method: "POST", path: path, body: body, timeout: timeout, resent: &resent})
	var e *Error
	errors.As(err, &e)
	switch {
	case err == nil:
		it.mu.Lock()
		it.released = true
		it.mu.Unlock()
		s.drop(&it.guard)
		it.markReleased()
		return got, nil
	case e != nil && e.Code == "session_not_found":
		s.lose(e)
	case e != nil && e.Code == "claim_lost":
		if resent {
			e = &Error{Code: e.Code, Status: e.Status, Message: fmt.Sprintf("%s (the first %s's answer was lost: it may have %sed the item)", e.Message, verb, verb)}
			err = e
		}
		s.drop(&it.guard)
		it.markLost(e)
	}
	return answer{}, err
}

func (it *Item) String() string {
	return fmt.Sprintf("permit.Item(%s/%s, attempt=%d, token=%d)", it.name, it.id, it.attempt, it.token)
}

// QueueSettings are a queue's settings for PutQueue; a zero field takes the default for a new
// queue and keeps the current value of an existing one.
type QueueSettings struct {
	MaxAttempts int    // claims of one item before it is dead-lettered: 1 to 1000 (default 5)
	DeadLetter  string // the dead-letter queue (default "{name}.dead"); not the queue itself
	MaxItems    uint64 // most items held; a push beyond is refused with queue_full (default 1,000,000)
}

// QueueInfo is a queue as the server sees it (a linearizable read).
type QueueInfo struct {
	Name        string
	Pending     uint64 // due, waiting for a claim
	Claimed     uint64 // claimed by a live session
	Delayed     uint64 // pushed or nacked with a delay that has not passed
	MaxAttempts int
	DeadLetter  string // "" when the queue has none (a dead-letter queue itself)
	MaxItems    uint64
	Claimers    uint64 // sessions blocked in a claim
	// OldestPending is how long the oldest pending item has waited (leader time); 0 when none.
	OldestPending time.Duration
	Index         uint64 // Raft log index of the queue's last change
}

type queueView struct {
	Name            string  `json:"name"`
	Pending         uint64  `json:"pending"`
	Claimed         uint64  `json:"claimed"`
	Delayed         uint64  `json:"delayed"`
	MaxAttempts     int     `json:"max_attempts"`
	DeadLetter      *string `json:"dead_letter"`
	MaxItems        uint64  `json:"max_items"`
	Claimers        uint64  `json:"claimers"`
	OldestPendingMs *uint64 `json:"oldest_pending_ms"`
	Index           uint64  `json:"index"`
}

func (v queueView) info() *QueueInfo {
	info := &QueueInfo{Name: v.Name, Pending: v.Pending, Claimed: v.Claimed, Delayed: v.Delayed,
		MaxAttempts: v.MaxAttempts, MaxItems: v.MaxItems, Claimers: v.Claimers, Index: v.Index}
	if v.DeadLetter != nil {
		info.DeadLetter = *v.DeadLetter
	}
	if v.OldestPendingMs != nil {
		info.OldestPending = time.Duration(*v.OldestPendingMs) * time.Millisecond
	}
	return info
}

// PutQueue creates queue name with settings, or changes the given settings of an existing one.
func (c *Client) PutQueue(ctx context.Context, name string, settings QueueSettings) (*QueueInfo, error) {
	body := map[string]any{}
	if settings.MaxAttempts != 0 {
		body["max_attempts"] = settings.MaxAttempts
	}
	if settings.DeadLetter != "" {
		body["dead_letter"] = settings.DeadLetter
	}
	if settings.MaxItems != 0 {
		body["max_items"] = settings.MaxItems
	}
	var view queueView
	if err := c.get(ctx, call{method: "PUT", path: "/v1/queues/" + segment(name), body: body}, &view); err != nil {
		return nil, err
	}
	return view.info(), nil
}

// Queue reads queue name: its counts by state, blocked claimers and settings. ErrNotFound
// (code queue_not_found) when it does not exist.
func (c *Client) Queue(ctx context.Context, name string) (*QueueInfo, error) {
	var view queueView
	if err := c.get(ctx, call{method: "GET", path: "/v1/queues/" + segment(name)}, &view); err != nil {
		return nil, err
	}
	return view.info(), nil
}

// Queues lists the queues the caller may read, in name order (all pages).
func (c *Client) Queues(ctx context.Context) ([]QueueInfo, error) {
	var out []QueueInfo
	after := ""
	for {
		cl := call{method: "GET", path: "/v1/queues", query: url.Values{"limit": {"1000"}}}
		if after != "" {
			cl.query.Set("after", after)
		}
		var page struct {
			Queues    []queueView `json:"queues"`
			NextAfter *string     `json:"next_after"`
		}
		if err := c.get(ctx, cl, &page); err != nil {
			return nil, err
		}
		for _, v := range page.Queues {
			out = append(out, *v.info())
		}
		if page.NextAfter == nil || *page.NextAfter == "" || *page.NextAfter == after {
			return out, nil
		}
		after = *page.NextAfter
	}
}

// DeleteQueue deletes a queue that holds no item and no blocked claim; otherwise ErrConflict
// (code queue_busy).
func (c *Client) DeleteQueue(ctx context.Context, name string) error {
	return c.get(ctx, call{method: "DELETE", path: "/v1/queues/" + segment(name)}, nil)
}
