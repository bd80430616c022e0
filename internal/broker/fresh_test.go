package broker

import (
	"context"
	"testing"
)

// A fresh item skips the lookup of its id among the partition's stored
// messages: the producer vouches for it, so the broker takes its word
// (and stores a repeat). Its id is still recorded: a later push of the
// same id without the mark is a duplicate of it.
func TestFreshItemsSkipTheLookup(t *testing.T) {
	b := openBroker(t)
	ctx := context.Background()
	push := func(txid string, fresh bool) PushOutcome {
		t.Helper()
		out, err := b.Push(ctx, "default", []PushItem{{Queue: "q", Partition: "p", TxID: txid, Payload: []byte(`1`), Fresh: fresh}})
		if err != nil {
			t.Fatal(err)
		}
		if len(out) != 1 {
			t.Fatalf("%d outcomes", len(out))
		}
		return out[0]
	}
	first := push("a", true)
	if first.Duplicate || first.Offset != 0 {
		t.Fatalf("first push: %+v", first)
	}
	if again := push("a", false); !again.Duplicate || again.Offset != 0 {
		t.Fatalf("the fresh item's id was not recorded: a repeat without the mark got %+v", again)
	}
	if vouched := push("a", true); vouched.Duplicate || vouched.Offset != 1 {
		t.Fatalf("a fresh item was looked up: %+v", vouched)
	}
	if plain := push("b", false); plain.Duplicate || plain.Offset != 2 {
		t.Fatalf("a new id: %+v", plain)
	}
}
