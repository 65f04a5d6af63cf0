package permit

import (
	"context"
	"net/url"
	"strconv"
	"time"
)

// SemaphoreInfo is a semaphore as the server sees it (a linearizable read).
type SemaphoreInfo struct {
	Name      string   `json:"name"`
	Capacity  uint64   `json:"capacity"`
	Held      uint64   `json:"held"`      // permits held now (may exceed Capacity right after a shrink)
	Available uint64   `json:"available"` // Capacity - Held, or 0
	Holders   []Holder `json:"holders"`
	Waiters   []Waiter `json:"waiters"` // in queue order
	Index     uint64   `json:"index"`   // Raft log index of the semaphore's last change
}

// Holder is a session holding permits of a semaphore.
type Holder struct {
	Session     string `json:"session"`
	SessionName string `json:"session_name,omitempty"`
	Permits     uint64 `json:"permits"`
	Token       uint64 `json:"token"`
}

// Waiter is a session queued for permits of a semaphore, at its 1-based Position.
type Waiter struct {
	Session     string `json:"session"`
	SessionName string `json:"session_name,omitempty"`
	Permits     uint64 `json:"permits"`
	Position    uint64 `json:"position"`
}

// Leader is the leader of an election. The zero Leader (empty Session) means nobody leads.
type Leader struct {
	Session     string `json:"session"`
	SessionName string `json:"session_name,omitempty"`
	Value       string `json:"value"`
	Token       uint64 `json:"token"`
}

// SetCapacity creates semaphore name with capacity permits, or changes its capacity (a
// semaphore made on the fly by Acquire with Capacity becomes permanent).
func (c *Client) SetCapacity(ctx context.Context, name string, capacity uint64) (*SemaphoreInfo, error) {
	info := new(SemaphoreInfo)
	err := c.get(ctx, call{method: "PUT", path: "/v1/semaphores/" + segment(name), body: map[string]uint64{"capacity": capacity}}, info)
	if err != nil {
		return nil, err
	}
	return info, nil
}

// Semaphore reads semaphore name: capacity, availability, holders and waiters
// (linearizable). ErrNotFound when it does not exist.
func (c *Client) Semaphore(ctx context.Context, name string) (*SemaphoreInfo, error) {
	info := new(SemaphoreInfo)
	if err := c.get(ctx, call{method: "GET", path: "/v1/semaphores/" + segment(name)}, info); err != nil {
		return nil, err
	}
	return info, nil
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
