package permit_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"permit.dev/go/permit"
)

func ExampleClient_Take() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	// A third-party API allows 60 calls a minute, 2 at most at once.
	client.SetCapacity(ctx, "example-api-quota", 1, permit.Rate(60, time.Minute, 2))

	for i := 0; i < 3; i++ {
		// A wait of 0 answers at once.
		_, err := client.Take(ctx, "example-api-quota", 1, 0)
		var e *permit.Error
		if errors.As(err, &e) && errors.Is(err, permit.ErrRateLimited) {
			fmt.Println("rate limited; room again within a second:", e.RetryAfter <= time.Second)
			continue
		} else if err != nil {
			log.Fatal(err)
		}
		fmt.Println("taken: call the API")
	}
	// Waits its turn in the semaphore's queue, for at most 5 s.
	if _, err := client.Take(ctx, "example-api-quota", 1, 5*time.Second); err != nil {
		log.Fatal(err) // errors.Is(err, permit.ErrRateLimited): no room within 5 s
	}
	fmt.Println("taken after a wait")
	// Output:
	// taken: call the API
	// taken: call the API
	// rate limited; room again within a second: true
	// taken after a wait
}

func ExampleRate() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	// 4 calls in flight and 10 per second, bursts of up to 20: acquires obey both.
	info, err := client.SetCapacity(ctx, "example-llm", 4, permit.Rate(10, time.Second, 20))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(info.Capacity, info.Rate.Permits, info.Rate.Per, info.Rate.Burst, info.Rate.Available)

	// A SetCapacity that does not name a policy keeps it; NoRate removes the rate.
	info, _ = client.SetCapacity(ctx, "example-llm", 8)
	fmt.Println(info.Capacity, info.Rate != nil)
	info, _ = client.SetCapacity(ctx, "example-llm", 8, permit.NoRate())
	fmt.Println(info.Rate == nil)
	// Output:
	// 4 10 1s 20 20
	// 8 true
	// true
}

func ExampleLockDelay() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	// The permits of a holder that fails (its session expires, or an admin revokes its hold)
	// stay out of circulation for 5 s, so that a holder that was only cut off has time to
	// notice; a release returns them at once.
	info, err := client.SetCapacity(ctx, "example-leader-lock", 1, permit.LockDelay(5*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(info.LockDelay, len(info.Delayed))
	// Output: 5s 0
}

func ExampleGroup() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	// 16 GPU slots, at most 4 for any one team.
	client.SetCapacity(ctx, "example-gpus", 16, permit.GroupMax(4))
	session, _ := client.NewSession(ctx)
	defer session.Close(ctx)

	// While team-a holds 4, its acquires are passed over (keeping their places) and the other
	// teams' are served.
	hold, err := session.Acquire(ctx, "example-gpus", permit.Permits(2), permit.Group("team-a"))
	if err != nil {
		log.Fatal(err)
	}
	defer hold.Release(ctx)
	info, _ := client.Semaphore(ctx, "example-gpus")
	fmt.Println(info.GroupMax, info.Holders[0].Group, info.Groups[0].Group, info.Groups[0].Held)
	// Output: 4 team-a team-a 2
}
