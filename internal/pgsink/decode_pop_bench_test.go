package pgsink

import (
	"context"
	"testing"

	"github.com/queen-mq/queen/internal/broker"
)

// BenchmarkDecodeBatchPop is BenchmarkDecodeBatch with the messages in the
// order a pop delivers them: partition after partition, each in offset
// order, then the batch's ops classified and grouped into runs, and the
// run's COPY data made, as a worker does before it writes (with the
// storage of the batch before, as a worker's committed batches leave it).
func BenchmarkDecodeBatchPop(b *testing.B) {
	w := benchDecodeWorker()
	msgs := make([]broker.Delivery, 500)
	for i := range msgs {
		// 16 partitions from the 9th on, as a pop's round robin serves them
		pid := (i*16/len(msgs)+8)%16 + 1
		msgs[i] = broker.Delivery{PartitionID: uint64(pid), Offset: uint64(i), Payload: []byte(benchRow(i))}
	}
	b.ReportAllocs()
	for b.Loop() {
		items, parts := w.group(msgs)
		bufs, err := w.decodeInto(context.Background(), items, parts, w.takeBufs())
		if err != nil {
			b.Fatal(err)
		}
		todo, err := w.classify(context.Background(), &result{items: items}, parts)
		if err != nil {
			b.Fatal(err)
		}
		rs := runs(todo)
		st := w.newCopyStep()
		w.appendCopyRun(st, rs[0])
		if len(rs) != 1 || len(st.data) < 500*100 {
			b.Fatal("not one COPY run")
		}
		w.copyBuf = st.data[:0]
		if st.borrowed {
			w.copyBuf = nil
		}
		w.recycle(&decodedBatch{bufs: bufs}) // committed
	}
}
