package broker

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkPushNewPartitions pushes bundles of 1,000 messages, each with a
// transaction id, the way a database source does: either every message to
// a partition that does not exist yet (a snapshot: one partition per row
// key) or over 16 existing partitions; with Push, and with Transaction
// carrying a KV put of the source's pointer. It reports msgs/s and the
// process CPU time per message.
// Run: go test ./internal/broker -run '^$' -bench BenchmarkPushNewPartitions -count 5
func BenchmarkPushNewPartitions(b *testing.B) {
	const bundle = 1000
	for _, api := range []string{"push", "transaction"} {
		for _, mode := range []string{"new", "existing16"} {
			b.Run(api+"/partitions="+mode, func(b *testing.B) {
				br := openBroker(b)
				ctx := context.Background()
				n := 0
				b.ResetTimer()
				cpu0, start := cpuNow(), time.Now()
				for i := 0; i < b.N; i++ {
					items := make([]PushItem, bundle)
					for j := range items {
						part := fmt.Sprintf("p%d", j%16)
						if mode == "new" {
							part = fmt.Sprintf("row-%09d", n)
						}
						items[j] = PushItem{Queue: "src", Partition: part, TxID: fmt.Sprintf("snap-1-%09d", n), Payload: []byte(`{"id":1,"name":"abcdefghijklmnop"}`)}
						n++
					}
					if api == "push" {
						if _, err := br.Push(ctx, "default", items); err != nil {
							b.Fatal(err)
						}
						continue
					}
					_, err := br.Transaction(ctx, TxnRequest{Tenant: "default", Internal: true, Ops: []TxnOp{
						{Type: OpPush, Items: items},
						{Type: OpKVPut, Key: "__queen/bench/pointer", Value: []byte(fmt.Sprintf(`{"row":%d}`, n))},
					}})
					if err != nil {
						b.Fatal(err)
					}
				}
				el, cpu := time.Since(start), cpuNow()-cpu0
				b.ReportMetric(float64(n)/el.Seconds(), "msgs/s")
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(n), "cpu-ns/msg")
			})
		}
	}
}
