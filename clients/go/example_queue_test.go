package permit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"time"

	"permit.dev/go/permit"
)

// The queue examples, like the others, run against the server PERMIT_SERVER names; each uses
// queues of its own.

type resize struct {
	Image string `json:"image"`
	Width int    `json:"width"`
}

func ExampleClient_Push() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	// Creates the queue with the defaults if needed; the payload is encoded with encoding/json.
	pushed, err := client.Push(ctx, "example-resize", resize{"cat.png", 640})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(pushed.ID != "", pushed.Duplicate)

	session, _ := client.NewSession(ctx)
	defer session.Close(ctx)
	items, _ := session.Claim(ctx, "example-resize")
	items[0].Ack(ctx)
	// Output: true false
}

func ExampleClient_PushMany() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	// All or nothing, in order, in one log entry (up to 1000 items).
	pushed, err := client.PushMany(ctx, "example-batch", []permit.PushItem{
		{Payload: resize{"a.png", 100}},
		{Payload: resize{"b.png", 200}, Key: "b.png"},
		{Payload: json.RawMessage(`{"image":"c.png","width":300}`), Delay: time.Hour},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(pushed), pushed[0].Seq < pushed[1].Seq)

	info, _ := client.Queue(ctx, "example-batch")
	fmt.Println(info.Pending, info.Delayed)
	session, _ := client.NewSession(ctx)
	defer session.Close(ctx)
	items, _ := session.Claim(ctx, "example-batch", permit.Max(2))
	for _, item := range items {
		item.Ack(ctx)
	}
	// Output:
	// 3 true
	// 2 1
}

func ExampleKey() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	// While the first is pending, delayed or claimed, a push with the same key adds nothing.
	first, _ := client.Push(ctx, "example-dedupe", "report 2026-12", permit.Key("report-2026-12"))
	again, _ := client.Push(ctx, "example-dedupe", "report 2026-12", permit.Key("report-2026-12"))
	fmt.Println(again.Duplicate, again.ID == first.ID)

	session, _ := client.NewSession(ctx)
	defer session.Close(ctx)
	items, _ := session.Claim(ctx, "example-dedupe", permit.Max(10))
	fmt.Println(len(items))
	items[0].Ack(ctx)
	// Output:
	// true true
	// 1
}

func ExampleDelay() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	// Out of claims for a minute.
	client.Push(ctx, "example-later", "reminder", permit.Delay(time.Minute))
	info, _ := client.Queue(ctx, "example-later")
	fmt.Println(info.Pending, info.Delayed)

	session, _ := client.NewSession(ctx)
	defer session.Close(ctx)
	items, _ := session.TryClaim(ctx, "example-later")
	fmt.Println(len(items))
	// Output:
	// 0 1
	// 0
}

func ExampleSession_Claim() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	session, _ := client.NewSession(ctx, permit.SessionTTL(10*time.Second))
	defer session.Close(ctx) // the items it still holds are pending again at once

	client.PutQueue(ctx, "example-jobs", permit.QueueSettings{}) // a claim needs the queue
	go client.Push(ctx, "example-jobs", resize{"dog.png", 320})

	// Waits (pushed by the server, FIFO among claimers) until an item comes, or ctx ends.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	items, err := session.Claim(wctx, "example-jobs")
	if errors.Is(err, permit.ErrTimeout) {
		log.Fatal("nothing to do for a minute; no claim is left waiting")
	} else if err != nil {
		log.Fatal(err)
	}
	for _, item := range items {
		var job resize
		if err := item.Payload(&job); err != nil {
			item.Nack(ctx, permit.Reason(err.Error()))
			continue
		}
		fmt.Println(job.Image, job.Width, item.Attempt())
		item.Ack(ctx) // done: the item is gone
	}
	// Output: dog.png 320 1
}

func ExampleMax() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	client.PushMany(ctx, "example-max", []permit.PushItem{{Payload: 1}, {Payload: 2}, {Payload: 3}})
	session, _ := client.NewSession(ctx)
	defer session.Close(ctx)
	// Up to 2 items, in seq order.
	items, _ := session.Claim(ctx, "example-max", permit.Max(2))
	fmt.Println(len(items), string(items[0].RawPayload()), string(items[1].RawPayload()))
	rest, _ := session.Claim(ctx, "example-max", permit.Max(2))
	fmt.Println(len(rest))
	for _, item := range append(items, rest...) {
		item.Ack(ctx)
	}
	// Output:
	// 2 1 2
	// 1
}

func ExampleSession_TryClaim() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	session, _ := client.NewSession(ctx)
	defer session.Close(ctx)
	client.PutQueue(ctx, "example-idle", permit.QueueSettings{})
	// Never waits: no item and no error when nothing is due.
	items, err := session.TryClaim(ctx, "example-idle")
	fmt.Println(len(items), err)
	// Output: 0 <nil>
}

func ExampleItem_Ack() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	session, _ := client.NewSession(ctx)
	defer session.Close(ctx)
	client.Push(ctx, "example-ack", "work")
	items, _ := session.Claim(ctx, "example-ack")
	item := items[0]
	fmt.Println(item.Ack(ctx))
	// A claim is settled once: it ended with the ack.
	fmt.Println(errors.Is(item.Ack(ctx), permit.ErrClaimLost))
	// Output:
	// <nil>
	// true
}

func ExampleItem_Nack() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	session, _ := client.NewSession(ctx)
	defer session.Close(ctx)
	client.Push(ctx, "example-retry", "flaky work")
	items, _ := session.Claim(ctx, "example-retry")
	// Back in its place in the queue after 30 s; the reason is kept with the item.
	if err := items[0].Nack(ctx, permit.Delay(30*time.Second), permit.Reason("upstream timed out")); err != nil {
		log.Fatal(err)
	}
	info, _ := client.Queue(ctx, "example-retry")
	fmt.Println(info.Claimed, info.Delayed)
	// Output: 0 1
}

func ExampleItem_Lost() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	session, _ := client.NewSession(ctx)
	client.Push(ctx, "example-lost", "long work")
	items, _ := session.Claim(ctx, "example-lost")
	item := items[0]

	session.Close(ctx) // as if the session were lost: the item is pending again for others
	select {
	case <-item.Lost(): // stop the work: the item is someone else's now
		fmt.Println("lost")
	case <-time.After(time.Minute):
	}
	info, _ := client.Queue(ctx, "example-lost")
	fmt.Println(info.Pending, info.Claimed)

	other, _ := client.NewSession(ctx)
	defer other.Close(ctx)
	again, _ := other.Claim(ctx, "example-lost")
	fmt.Println(again[0].ID() == item.ID(), again[0].Attempt(), again[0].Token() > item.Token())
	again[0].Ack(ctx)
	// Output:
	// lost
	// 1 0
	// true 2 true
}

func ExampleItem_Token() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	session, _ := client.NewSession(ctx)
	defer session.Close(ctx)
	client.Push(ctx, "example-fenced", "write")
	items, _ := session.Claim(ctx, "example-fenced")
	// A sink that keeps the largest token it saw refuses a stale worker's late write.
	largest := uint64(0)
	write := func(token uint64) bool {
		if token < largest {
			return false
		}
		largest = token
		return true
	}
	fmt.Println(write(items[0].Token()), write(items[0].Token()-1))
	items[0].Ack(ctx)
	// Output: true false
}

func ExampleClient_PutQueue() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	// Three claims without an ack, then the item moves to "example-mail.failed".
	info, err := client.PutQueue(ctx, "example-mail", permit.QueueSettings{MaxAttempts: 3, DeadLetter: "example-mail.failed"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(info.MaxAttempts, info.DeadLetter, info.MaxItems)
	// Output: 3 example-mail.failed 1000000
}

func ExampleClient_Queue() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	client.Push(ctx, "example-depth", "one")
	info, err := client.Queue(ctx, "example-depth")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(info.Pending, info.Claimed, info.Delayed, info.Claimers, info.DeadLetter)
	_, err = client.Queue(ctx, "example-nothing-here")
	fmt.Println(errors.Is(err, permit.ErrNotFound))
	// Output:
	// 1 0 0 0 example-depth.dead
	// true
}

func ExampleClient_Queues() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	client.PutQueue(ctx, "example-listed", permit.QueueSettings{})
	queues, err := client.Queues(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, q := range queues {
		if q.Name == "example-listed" {
			fmt.Println(q.Name, q.Pending)
		}
	}
	// Output: example-listed 0
}

func ExampleClient_DeleteQueue() {
	ctx := context.Background()
	client, _ := permit.NewClient(nil)
	defer client.Close()
	client.PutQueue(ctx, "example-gone", permit.QueueSettings{})
	fmt.Println(client.DeleteQueue(ctx, "example-gone"))
	// Only an empty queue: one holding items is busy.
	client.Push(ctx, "example-busy", "item")
	fmt.Println(errors.Is(client.DeleteQueue(ctx, "example-busy"), permit.ErrConflict))
	// Output:
	// <nil>
	// true
}
