package pgsink

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/broker"
)

func BenchmarkPopAck(b *testing.B) {
	bk := openBroker(b)
	rows := make([]string, 100000)
	for i := range rows {
		rows[i] = benchRow(i)
	}
	pushRows(b, bk, "pa", rows, 16)
	start := time.Now()
	got := 0
	ctx := context.Background()
	for got < len(rows) {
		resp, err := bk.Pop(ctx, broker.PopRequest{Tenant: "default", Queue: "pa", Group: "g", Batch: 500, Partitions: 500, SubscriptionMode: "all", LeaseSeconds: 60})
		if err != nil {
			b.Fatal(err)
		}
		var items []broker.AckItem
		for _, m := range resp.Messages {
			off := m.Offset
			items = append(items, broker.AckItem{PartitionID: m.PartitionID, Offset: &off, Group: "g", LeaseID: resp.LeaseID, Status: "completed"})
		}
		if len(items) > 0 {
			if _, err := bk.Ack(ctx, "default", items); err != nil {
				b.Fatal(err)
			}
		}
		got += len(resp.Messages)
	}
	fmt.Printf("pop+ack only: %.0f msgs/s\n", float64(got)/time.Since(start).Seconds())
}
