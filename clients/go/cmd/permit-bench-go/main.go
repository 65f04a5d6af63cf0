// Command permit-bench-go is the benchmark driver of the Go client, run by permit-bench (part
// go) beside the Rust driver's rows.
//
// W1: one session, capacity 4, loop {TryAcquire 1; Release}. W2: -clients sessions (one per
// goroutine), capacity 4, loop {Acquire; Release}. It prints one JSON line of figures in
// milliseconds.
//
//	permit-bench-go -url http://127.0.0.1:7376 -workload w1 -duration 3s
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"permit.dev/go/permit"
)

func main() {
	url := flag.String("url", permit.DefaultEndpoint, "the server")
	name := flag.String("name", "go-bench", "the semaphore")
	workload := flag.String("workload", "w1", "w1 (uncontended) or w2 (contended)")
	duration := flag.Duration("duration", 3*time.Second, "length of the timed run")
	clients := flag.Int("clients", 32, "sessions (goroutines) of w2")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), *duration+time.Minute)
	defer cancel()
	client, err := permit.NewClient([]string{*url})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	if _, err := client.SetCapacity(ctx, *name, 4); err != nil {
		log.Fatal(err)
	}
	var out map[string]any
	switch *workload {
	case "w1":
		out, err = uncontended(ctx, client, *name, *duration)
	case "w2":
		out, err = contended(ctx, client, *name, *duration, *clients)
	default:
		err = fmt.Errorf("unknown workload %q", *workload)
	}
	if err != nil {
		log.Fatal(err)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		log.Fatal(err)
	}
}

func uncontended(ctx context.Context, client *permit.Client, name string, duration time.Duration) (map[string]any, error) {
	session, err := client.NewSession(ctx, permit.SessionTTL(time.Minute))
	if err != nil {
		return nil, err
	}
	defer session.Close(ctx)
	var acquire, release []time.Duration
	started := time.Now()
	for time.Since(started) < duration {
		t := time.Now()
		hold, err := session.TryAcquire(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("uncontended acquire: %w", err)
		}
		acquire = append(acquire, time.Since(t))
		t = time.Now()
		if err := hold.Release(ctx); err != nil {
			return nil, err
		}
		release = append(release, time.Since(t))
	}
	return summary(float64(len(acquire))/time.Since(started).Seconds(), acquire, release), nil
}

func contended(ctx context.Context, client *permit.Client, name string, duration time.Duration, clients int) (map[string]any, error) {
	sessions := make([]*permit.Session, clients)
	for i := range sessions {
		s, err := client.NewSession(ctx, permit.SessionTTL(2*time.Minute))
		if err != nil {
			return nil, err
		}
		defer s.Close(ctx)
		sessions[i] = s
	}
	var mu sync.Mutex
	var waits []time.Duration
	var now, peak atomic.Int64
	errs := make(chan error, clients)
	end := time.Now().Add(duration)
	started := time.Now()
	var wg sync.WaitGroup
	for _, s := range sessions {
		wg.Add(1)
		go func(s *permit.Session) {
			defer wg.Done()
			var mine []time.Duration
			for time.Now().Before(end) {
				t := time.Now()
				hold, err := s.Acquire(ctx, name)
				if err != nil {
					errs <- err
					return
				}
				mine = append(mine, time.Since(t))
				n := now.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				now.Add(-1)
				if err := hold.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
			mu.Lock()
			waits = append(waits, mine...)
			mu.Unlock()
		}(s)
	}
	wg.Wait()
	elapsed := time.Since(started)
	close(errs)
	if err, failed := <-errs; failed {
		return nil, err
	}
	out := summary(float64(len(waits))/elapsed.Seconds(), waits, nil)
	out["max_holders"] = peak.Load()
	return out, nil
}

func summary(rate float64, first, second []time.Duration) map[string]any {
	return map[string]any{
		"cycles_per_second": rate,
		"p50_ms":            quantile(first, 0.5),
		"p99_ms":            quantile(first, 0.99),
		"release_p50_ms":    quantile(second, 0.5),
	}
}

// quantile is the q-quantile of values in milliseconds (0 for none).
func quantile(values []time.Duration, q float64) float64 {
	if len(values) == 0 {
		return 0
	}
	sorted := append([]time.Duration(nil), values...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	i := int(q * float64(len(sorted)))
	if i >= len(sorted) {
		i = len(sorted) - 1
	}
	return float64(sorted[i]) / float64(time.Millisecond)
}
