package state

import (
	"fmt"
	"reflect"
	"testing"
)

// TestPushDecodeAllocs: a push of 1,000 items into new partitions, each with
// its own partition name and transaction id, decodes in a handful of
// allocations (the command, its items, its tenant, a few blocks for all
// the items' strings) instead of two or three per item, and decodes to what
// was encoded, queue names that change between items included.
func TestPushDecodeAllocs(t *testing.T) {
	p := &Push{Tenant: "default", Items: make([]PushItem, 1000)}
	for i := range p.Items {
		p.Items[i] = PushItem{Queue: "orders", Partition: fmt.Sprint(i), TxID: fmt.Sprintf("pg:00000001:%016X:%d", 7, i), Payload: []byte(`{"id":1}`)}
		if i%300 == 299 {
			p.Items[i].Queue, p.Items[i].TraceID = "other", "trace"
		}
	}
	b := encodePush(p)
	got, err := decodePush(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, p) {
		t.Fatalf("decoded %+v", got.Items[:3])
	}
	n := testing.AllocsPerRun(20, func() { decodePush(b) })
	t.Logf("a push of %d items decodes in %.0f allocations", len(p.Items), n)
	if n > 8 {
		t.Fatalf("decoding a push of %d items allocated %.0f times", len(p.Items), n)
	}
	// A truncated push is refused at any length.
	for n := 0; n < len(b); n += 97 {
		if _, err := decodePush(b[:n]); err == nil {
			t.Fatalf("a push cut at %d of %d bytes decoded", n, len(b))
		}
	}
}
