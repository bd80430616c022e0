package broker

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

)

func TestDbgPipeline(t *testing.T) {
	b := openBroker(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	start := time.Now()
	var n int64
	var mu sync.Mutex
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; time.Since(start) < 5*time.Second; i++ {
				items := make([]PushItem, 100)
				for j := range items {
					items[j] = PushItem{Queue: "d", Partition: fmt.Sprintf("p%d", (i*100+j)%100), Payload: []byte(`{"x":"abcdefghijklmnopqrstuvwx"}`)}
				}
				if _, err := b.Push(ctx, "default", items); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				n += 100
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	el := time.Since(start)
	t.Logf("msgs/s %.0f", float64(n)/el.Seconds())
}

func TestDbgConsume(t *testing.T) {
	b := openBroker(t)
	ctx := context.Background()
	for i := 0; i < 1000; i++ {
		items := make([]PushItem, 100)
		for j := range items {
			items[j] = PushItem{Queue: "c", Partition: fmt.Sprintf("p%d", j), Payload: []byte(`{"x":"abcdefghijklmnopqrstuvwx"}`)}
		}
		if _, err := b.Push(ctx, "default", items); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	start := time.Now()
	var n int64
	var mu sync.Mutex
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				r, err := b.Pop(ctx, PopRequest{Tenant: "default", Queue: "c", Group: "g", SubscriptionMode: "all", Batch: 100, Partitions: 10})
				if err != nil {
					t.Error(err)
					return
				}
				if len(r.Messages) == 0 {
					return
				}
				acks := make([]AckItem, len(r.Messages))
				for j, m := range r.Messages {
					acks[j] = AckItem{TxID: m.TxID, PartitionID: m.PartitionID, Group: "g", LeaseID: r.LeaseID}
				}
				if _, err := b.Ack(ctx, "default", acks); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				n += int64(len(r.Messages))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	t.Logf("consumed %d, msgs/s %.0f", n, float64(n)/el.Seconds())
}
