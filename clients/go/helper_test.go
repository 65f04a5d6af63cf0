package permit_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"permit.dev/go/permit"
)

// helperEnv names the role when the test binary runs as a helper process (see TestMain).
const helperEnv = "PERMIT_GO_TEST_HELPER"

// runHelper runs a helper process's role and returns its exit status.
func runHelper(role string) int {
	switch role {
	case "holder":
		if err := holder(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(os.Stderr, "unknown helper role %q\n", role)
	return 2
}

// holder acquires semaphore PERMIT_TEST_NAME (capacity PERMIT_TEST_CAPACITY) PERMIT_TEST_ROUNDS
// times; while it holds, it counts itself in the file PERMIT_TEST_COUNTER (under flock), and
// fails if the count ever exceeds the capacity. The file's second number is the peak.
func holder() error {
	name := os.Getenv("PERMIT_TEST_NAME")
	capacity, _ := strconv.Atoi(os.Getenv("PERMIT_TEST_CAPACITY"))
	rounds, _ := strconv.Atoi(os.Getenv("PERMIT_TEST_ROUNDS"))
	counter := os.Getenv("PERMIT_TEST_COUNTER")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := permit.NewClient(nil) // PERMIT_SERVER
	if err != nil {
		return err
	}
	defer c.Close()
	s, err := c.NewSession(ctx, permit.SessionTTL(5*time.Second))
	if err != nil {
		return err
	}
	defer s.Close(ctx)
	for r := 0; r < rounds; r++ {
		h, err := s.Acquire(ctx, name, permit.Capacity(uint64(capacity)), permit.KeepSemaphore())
		if err != nil {
			return err
		}
		if err := count(counter, +1, capacity); err != nil {
			return err
		}
		time.Sleep(2 * time.Millisecond) // the work the permit guards
		if err := count(counter, -1, capacity); err != nil {
			return err
		}
		if err := h.Release(ctx); err != nil {
			return err
		}
	}
	return nil
}

// count adds delta to the holders counted in path, under an exclusive flock.
func count(path string, delta, capacity int) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	var now, peak int
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	fmt.Sscan(string(data), &now, &peak)
	now += delta
	if now > peak {
		peak = now
	}
	if err := f.Truncate(0); err != nil {
		return err
	}
	if _, err := f.WriteAt([]byte(fmt.Sprintf("%d %d\n", now, peak)), 0); err != nil {
		return err
	}
	if now > capacity {
		return fmt.Errorf("%d holders at once, capacity %d", now, capacity)
	}
	return nil
}
