package permit

import (
	"context"
	"errors"
	"math"
	"net/url"
	"strconv"
	"time"
)

// SemaphoreInfo is a semaphore as the server sees it (a linearizable read), with its policies
// (see SetCapacity). Servers older than the policies answer none: the policy fields stay zero.
type SemaphoreInfo struct {
	Name     string `json:"name"`
	Capacity uint64 `json:"capacity"`
	Held     uint64 `json:"held"` // permits held now (may exceed Capacity right after a shrink)
	// Available is Capacity less Held and the Delayed permits, or 0.
	Available uint64   `json:"available"`
	Holders   []Holder `json:"holders"`
	Waiters   []Waiter `json:"waiters"` // in queue order
	Index     uint64   `json:"index"`   // Raft log index of the semaphore's last change

	// Rate is the semaphore's rate with its state now; nil when it has none.
	Rate *RateInfo `json:"-"`
	// LockDelay is how long the permits of a hold that ends by expiry or revoke stay out of
	// circulation; 0 for none.
	LockDelay time.Duration `json:"-"`
	// Delayed are the permits the lock-delay keeps out of circulation now, soonest back first.
	Delayed []DelayedPermits `json:"-"`
	// GroupMax is the most permits the holders of one group may hold at once; 0 for no cap.
	GroupMax uint64 `json:"-"`
	// Groups are the groups that hold or wait, in group order.
	Groups []GroupInfo `json:"groups"`
}

// RateInfo is a semaphore's rate as the server reads it now: the setting (Permits per Per
// sustained, at most Burst at once), the permits it would grant now (Available, 0 to Burst) and
// how long until it allows one more (Next; 0 when Available > 0). Leader time decides it.
type RateInfo struct {
	Permits   uint64
	Per       time.Duration
	Burst     uint64
	Available uint64
	Next      time.Duration
}

// DelayedPermits are permits of a failed hold (ended by its session's expiry or a revoke, not a
// release) that the lock-delay keeps out of circulation: they return at leader time UntilMs (ms
// since the Unix epoch by the leader's clock), Remaining after the read.
type DelayedPermits struct {
	Permits   uint64
	UntilMs   uint64
	Remaining time.Duration
}

// GroupInfo is one group of a semaphore (the Group of acquires): the permits its holders hold,
// its holders and its waiting acquires.
type GroupInfo struct {
	Group   string `json:"group"`
	Held    uint64 `json:"held"`
	Holders uint64 `json:"holders"`
	Waiters uint64 `json:"waiters"`
}

// Holder is a session holding permits of a semaphore.
type Holder struct {
	Session     string `json:"session"`
	SessionName string `json:"session_name,omitempty"`
	Permits     uint64 `json:"permits"`
	Token       uint64 `json:"token"`
	Group       string `json:"group,omitempty"` // the acquire's Group; "" for none
}

// Waiter is a session queued for permits of a semaphore, at its 1-based Position, or a waiting
// Take (then Take is true and Session is the take's own id, not a session's).
type Waiter struct {
	Session     string `json:"session"`
	SessionName string `json:"session_name,omitempty"`
	Permits     uint64 `json:"permits"`
	Position    uint64 `json:"position"`
	Group       string `json:"group,omitempty"` // the acquire's Group; "" for none
	Take        bool   `json:"take,omitempty"`
}

// semaphoreView is GET /v1/semaphores/{name} as the server sends it: the fields SemaphoreInfo
// reads as they are, and those it reads in Go units.
type semaphoreView struct {
	SemaphoreInfo
	Rate *struct {
		Permits   uint64 `json:"permits"`
		PerMs     uint64 `json:"per_ms"`
		Burst     uint64 `json:"burst"`
		Available uint64 `json:"available"`
		NextInMs  uint64 `json:"next_in_ms"`
	} `json:"rate"`
	LockDelayMs uint64 `json:"lock_delay_ms"`
	Delayed     []struct {
		Permits     uint64 `json:"permits"`
		UntilMs     uint64 `json:"until_ms"`
		RemainingMs uint64 `json:"remaining_ms"`
	} `json:"delayed"`
	GroupMax *uint64 `json:"group_max"`
}

func (v *semaphoreView) info() *SemaphoreInfo {
	info := v.SemaphoreInfo
	if r := v.Rate; r != nil {
		info.Rate = &RateInfo{Permits: r.Permits, Per: millis(r.PerMs), Burst: r.Burst, Available: r.Available, Next: millis(r.NextInMs)}
	}
	info.LockDelay = millis(v.LockDelayMs)
	for _, d := range v.Delayed {
		info.Delayed = append(info.Delayed, DelayedPermits{Permits: d.Permits, UntilMs: d.UntilMs, Remaining: millis(d.RemainingMs)})
	}
	if v.GroupMax != nil {
		info.GroupMax = *v.GroupMax
	}
	return &info
}

// millis is n milliseconds as a Duration (saturated: no server value comes near).
func millis(n uint64) time.Duration {
	if n > uint64(math.MaxInt64/time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(n) * time.Millisecond
}

// Leader is the leader of an election. The zero Leader (empty Session) means nobody leads.
type Leader struct {
	Session     string `json:"session"`
	SessionName string `json:"session_name,omitempty"`
	Value       string `json:"value"`
	Token       uint64 `json:"token"`
}

// SemaphoreOption sets one policy of a semaphore in SetCapacity: Rate or NoRate, LockDelay,
// GroupMax or NoGroupMax. A policy not given stays as it is (a new semaphore has none).
type SemaphoreOption func(semaphoreBody)

// semaphoreBody is the body of PUT /v1/semaphores/{name}: a nil value is sent as null, which
// removes the policy; an absent key keeps it.
type semaphoreBody map[string]any

// Rate makes the permits granted by acquires and takes (see Client.Take) obey a rate as well as
// the capacity: permits per per sustained (1 to 1,000,000 per 1 ms to a day; per is sent in
// whole milliseconds, rounded to the nearest), at most burst at once after a quiet spell (1 to
// 1,000,000; 0 for the default, permits). The server decides on the leader's clock (a generic
// cell rate algorithm), so clients' clocks never matter.
func Rate(permits uint64, per time.Duration, burst uint64) SemaphoreOption {
	return func(b semaphoreBody) {
		rate := map[string]uint64{"permits": permits, "per_ms": periodMs(per)}
		if burst != 0 {
			rate["burst"] = burst
		}
		b["rate"] = rate
	}
}

// NoRate removes the semaphore's rate.
func NoRate() SemaphoreOption { return func(b semaphoreBody) { b["rate"] = nil } }

// LockDelay keeps the permits of a hold that ends by its session's expiry or a revoke (not a
// release: that returns them at once) out of circulation for d (at most 60 s; 0 for none), so
// that a holder that was only cut off has time to notice before someone else acts.
// SemaphoreInfo.Delayed shows them.
func LockDelay(d time.Duration) SemaphoreOption {
	return func(b semaphoreBody) { b["lock_delay_ms"] = ms(d) }
}

// GroupMax caps the permits the holders of one group (see Group) may hold at once (1 to
// 1,000,000): a waiter whose grant would take its group above the cap is passed over, keeping
// its place, so that one group's backlog never blocks the others. The other waiters stay in
// strict FIFO order.
func GroupMax(n uint64) SemaphoreOption { return func(b semaphoreBody) { b["group_max"] = n } }

// NoGroupMax removes the semaphore's cap per group.
func NoGroupMax() SemaphoreOption { return func(b semaphoreBody) { b["group_max"] = nil } }

// periodMs is a rate's period in whole milliseconds, rounded to the nearest: it is a setting,
// not a wait (0 for a period under half a millisecond, which the server refuses).
func periodMs(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64(d.Round(time.Millisecond) / time.Millisecond)
}

// SetCapacity creates semaphore name with capacity permits, or changes its capacity (a
// semaphore made on the fly by Acquire with Capacity becomes permanent), and sets the policies
// that opts give (Rate, NoRate, LockDelay, GroupMax, NoGroupMax); the others stay as they are.
// A cluster with a member too old for the policies answers ErrConflict (code
// feature_unavailable); a value out of range, ErrInvalidRequest.
func (c *Client) SetCapacity(ctx context.Context, name string, capacity uint64, opts ...SemaphoreOption) (*SemaphoreInfo, error) {
	body := semaphoreBody{"capacity": capacity}
	for _, opt := range opts {
		opt(body)
	}
	var view semaphoreView
	if err := c.get(ctx, call{method: "PUT", path: "/v1/semaphores/" + segment(name), body: body}, &view); err != nil {
		return nil, err
	}
	return view.info(), nil
}

// Semaphore reads semaphore name: capacity, availability, holders and waiters, and its
// policies (linearizable). ErrNotFound when it does not exist.
func (c *Client) Semaphore(ctx context.Context, name string) (*SemaphoreInfo, error) {
	var view semaphoreView
	if err := c.get(ctx, call{method: "GET", path: "/v1/semaphores/" + segment(name)}, &view); err != nil {
		return nil, err
	}
	return view.info(), nil
}

// takeWaitMax is the longest wait one take asks of the server (its cap); a longer wait asks
// again, joining the queue at its end. A variable for a test's sake only.
var takeWaitMax = 60 * time.Second

// takePause is the pause before asking again after a take refused before its wait was up, when
// the server said no retry_after_ms.
const takePause = 100 * time.Millisecond

// Take takes permits of semaphore name's rate (see Rate), holding nothing and needing no
// session: a rate limiter. It returns the take's token (from the counter of grants: larger than
// every token before it). A semaphore without a rate takes at once, always.
//
// When the rate has no room (or others wait first), a wait of 0 fails at once with an *Error of
// code rate_limited (errors.Is ErrRateLimited and ErrLimitExceeded) whose RetryAfter says when
// the rate has room. A positive wait waits in the semaphore's FIFO queue, behind earlier
// acquires and takes, and fails so if it passes first; the server waits at most 60 s per
// request, and a longer wait asks again, joining the queue at its end. The wait also ends with
// ctx: the request is closed and the server ends the take (it leaves the queue and spends
// nothing, unless it was served a moment before), and the error unwraps to ctx's error
// (matching ErrTimeout for a deadline), unless the server's rate_limited answer came first. More permits than the rate's burst: ErrConflict (code
// permits_exceed_capacity); an unknown semaphore: ErrNotFound.
//
// A take spends the rate, so it is never sent again once it may have reached a server: after a
// connection lost in the middle (ErrClusterUnavailable) the permits may have been taken.
func (c *Client) Take(ctx context.Context, name string, permits uint64, wait time.Duration) (uint64, error) {
	if err := c.checkOpen(); err != nil {
		return 0, err
	}
	path := "/v1/semaphores/" + segment(name) + "/take"
	tryOnce := wait <= 0
	deadline := time.Now().Add(wait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		// The server's wait never outlives the caller's.
		deadline = d
	}
	for {
		slice := time.Duration(0)
		if !tryOnce {
			slice = maxDuration(minDuration(takeWaitMax, time.Until(deadline)), time.Millisecond)
		}
		sent := time.Now()
		body := map[string]uint64{"permits": permits, "wait_ms": ms(slice)}
		got, err := c.do(ctx, call{method: "POST", path: path, body: body, policy: unsent, timeout: maxDuration(c.timeout, slice+longPollMargin)})
		if err == nil {
			var taken struct {
				Token uint64 `json:"token"`
			}
			if err := got.decode(&taken); err != nil {
				return 0, err
			}
			return taken.Token, nil
		}
		now := time.Now()
		var limited *Error
		if !errors.As(err, &limited) || limited.Code != "rate_limited" || tryOnce || !now.Before(deadline) {
			return 0, err
		}
		if now.Sub(sent) < slice {
			// Refused before its wait was up: ask again when the server says the rate has
			// room, if that is in time, so that this loop never spins.
			pause := limited.RetryAfter
			if pause <= 0 {
				pause = takePause
			}
			if !now.Add(pause).Before(deadline) {
				return 0, err
			}
			if sleep(ctx, pause) != nil {
				return 0, contextError(ctx, "taking from semaphore "+name)
			}
		}
	}
}

// DeleteSemaphore deletes an idle semaphore; a held or awaited one gives ErrConflict
// (code semaphore_busy).
func (c *Client) DeleteSemaphore(ctx context.Context, name string) error {
	return c.get(ctx, call{method: "DELETE", path: "/v1/semaphores/" + segment(name)}, nil)
}

// Validate reports whether a current holder of semaphore name carries the fencing token
// (linearizable): what a protected resource asks before it accepts a write.
func (c *Client) Validate(ctx context.Context, name string, token uint64) (bool, error) {
	var out struct {
		Valid bool `json:"valid"`
	}
	err := c.get(ctx, call{method: "POST", path: "/v1/semaphores/" + segment(name) + "/validate", body: map[string]uint64{"token": token}}, &out)
	return out.Valid, err
}

type electionView struct {
	Leader *Leader `json:"leader"`
	Index  uint64  `json:"index"`
}

// Leader returns the current leader of election; the zero Leader when nobody leads.
func (c *Client) Leader(ctx context.Context, election string) (Leader, error) {
	var view electionView
	if err := c.get(ctx, call{method: "GET", path: "/v1/elections/" + segment(election)}, &view); err != nil {
		return Leader{}, err
	}
	if view.Leader == nil {
		return Leader{}, nil
	}
	return *view.Leader, nil
}

// ObserveLeader follows the leader of election: the channel gets the current leader at once
// (the zero Leader when nobody leads), then the new one each time it changes (a new session,
// or a proclaimed value). The server pushes the changes (blocking reads,
// GET /v1/elections/{name}?index=N); nothing polls. The channel is closed when ctx ends or
// the client is closed; while the cluster is unreachable the watch retries with backoff. A
// receiver that falls behind misses nothing but intermediate values: it gets the latest.
func (c *Client) ObserveLeader(ctx context.Context, election string) <-chan Leader {
	out := make(chan Leader, 1)
	go c.observe(ctx, election, out)
	return out
}

func (c *Client) observe(ctx context.Context, election string, out chan Leader) {
	defer close(out)
	// The blocking read in flight ends with the client too.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-c.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	path := "/v1/elections/" + segment(election)
	var index uint64
	first := true
	var last Leader
	pause := backoffMin
	for ctx.Err() == nil && c.checkOpen() == nil {
		cl := call{method: "GET", path: path}
		if !first {
			cl.query = url.Values{"index": {strconv.FormatUint(index, 10)}, "wait_ms": {strconv.FormatUint(ms(waitChunk), 10)}}
			cl.timeout = waitChunk + longPollMargin
		}
		var view electionView
		if err := c.get(ctx, cl, &view); err != nil {
			if sleep(ctx, pause) != nil {
				return
			}
			pause = minDuration(pause*2, backoffMax)
			continue
		}
		pause = backoffMin
		index = view.Index
		var leader Leader
		if view.Leader != nil {
			leader = *view.Leader
		}
		if first || leader != last {
			first, last = false, leader
			// The latest value wins over one the receiver has not taken yet.
			select {
			case <-out:
			default:
			}
			select {
			case out <- leader:
			case <-ctx.Done():
				return
			}
		}
	}
}

// get sends the call and decodes the answer into out (nil: ignored).
func (c *Client) get(ctx context.Context, cl call, out any) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	got, err := c.do(ctx, cl)
	if err != nil {
		return err
	}
	return got.decode(out)
}

func minDuration(a, b time.Duration) time.Duration {
	if a < b {
		return a
	}
	return b
}
