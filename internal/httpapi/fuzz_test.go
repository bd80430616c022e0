package httpapi

import (
	"fmt"
	"reflect"
	"testing"
)

func FuzzDecodePush(f *testing.F) {
	for _, s := range []string{
		`{"items":[{"queue":"q","partition":"p","payload":{"a":1},"transactionId":"t","traceId":null}]}`,
		`{"items":[{"queue":"q","payload":1.50e10}]}`,
		`{"items":"x"}`, `{"items":[{"queue":5}]}`, `{}`, `[]`, `nul`, `{"items":[{"queue":"q","partition":null}]}`,
		"{\"items\":[{\"queue\":\"q\",\"partition\":\"\\u0000\\n\"}]}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		items, e := DecodePush(b)
		if e != nil {
			if statusOf(e) != 400 || e.Code == "" {
				t.Fatalf("bad error %+v", e)
			}
			return
		}
		for _, it := range items {
			if len(it.Payload) == 0 {
				t.Fatalf("empty payload accepted from %q", b)
			}
		}
	})
}

func FuzzDecodeAck(f *testing.F) {
	for _, s := range []string{
		`{"transactionId":"t","partitionId":"17","status":"completed","consumerGroup":"g","leaseId":"l"}`,
		`{"consumerGroup":"g","acknowledgments":[{"transactionId":"t","partitionId":17,"status":"failed","error":"x"}]}`,
		`{"partitionId":"-1"}`, `{"partitionId":1e3}`, `{"acknowledgments":null}`, `{`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, e := DecodeAck(b); e != nil && statusOf(e) != 400 {
			t.Fatalf("bad error %+v", e)
		}
		if items, e := DecodeAckBatch(b); e != nil {
			if statusOf(e) != 400 {
				t.Fatalf("bad error %+v", e)
			}
		} else if items == nil {
			t.Fatalf("nil items without error from %q", b)
		}
	})
}

func FuzzDecodeTransaction(f *testing.F) {
	for _, s := range []string{
		`{"operations":[{"type":"push","items":[{"queue":"q","payload":1}]},{"type":"ack","transactionId":"t","partitionId":"1","consumerGroup":"g"},{"type":"kv.put","key":"k","value":{"a":1},"ifVersion":0,"ttlMs":10},{"type":"kv.delete","key":"k","ifVersion":4},{"type":"kv.check","key":"k"}],"requiredLeases":["x"]}`,
		`{"operations":[{"type":"kv.put"}]}`, `{"operations":[{}]}`, `{"operations":"x"}`, `{"operations":[{"type":"push","items":[{"queue":1}]}]}`,
		`{"operations":[{"type":"kv.put","key":"k","ifVersion":-1}]}`,
		`{"operAtions":[{"tYpe":"","keY":"0"}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, e := DecodeTransaction(b)
		if e != nil {
			if statusOf(e) != 400 || e.Code == "" {
				t.Fatalf("bad error %+v", e)
			}
			return
		}
		for _, op := range req.Ops {
			if op.Type == "" {
				t.Fatalf("operation without a type from %q", b)
			}
		}
	})
}

// FuzzFastDecoders: whenever the hand-written push and ack-batch decoders
// answer, encoding/json must accept the body and give the same items.
func FuzzFastDecoders(f *testing.F) {
	for _, s := range []string{
		`{"items":[{"queue":"q","partition":"p","payload":{"a":[1,2.5e-3,"x\u00e9\n"]},"transactionId":"t","traceId":null}]}`,
		`{"items":[{"queue":"q","payload":1.50e10}, {"queue":"é","payload":  [ true , false , null ] ,"extra":{"k":"v"}}]}`,
		`{"items":[]}`, `{"items":null}`, `{"items":[{"Queue":"q"}]}`, `{"items":[{"queue":"q"}],"items":[{"partition":"p"}]}`,
		`{"items":[{"queue":"q","queue":null}]}`, `{"items":[{"queue":"a\"b"}]}`, ` {"x":1, "items":[{"queue":"q","payload":-0}]} `,
		`{"consumerGroup":"g","acknowledgments":[{"transactionId":"t","partitionId":17,"status":"failed","error":"x","index":3}]}`,
		`{"acknowledgments":[{"transactionId":"t","partitionId":"17","offset":5,"leaseId":"l","consumerGroup":null}]}`,
		`{"acknowledgments":[{"partitionId":"017"}]}`, `{"acknowledgments":[{"offset":1.0}]}`, `{"acknowledgments":[{"index":1e999}]}`,
		`{"acknowledgments":[]}`, `{"acknowledgments":[{"partitionId":18446744073709551616}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if fast, ok := fastPush(b); ok {
			slow, e := decodePushSlow(b)
			if e != nil {
				t.Fatalf("fast push decoder accepted %q, encoding/json refuses it: %v", b, e)
			}
			if !reflect.DeepEqual(fast, slow) {
				t.Fatalf("push %q:\n fast %+v\n slow %+v", b, fast, slow)
			}
		}
		if fast, ok := fastAckBatch(b); ok {
			slow, e := decodeAckBatchSlow(b)
			if e != nil {
				t.Fatalf("fast ack decoder accepted %q, encoding/json refuses it: %v", b, e)
			}
			if !reflect.DeepEqual(fast, slow) {
				t.Fatalf("ack %q:\n fast %+v\n slow %+v", b, fast, slow)
			}
		}
	})
}

// The bodies clients send take the fast path (otherwise it is dead code).
func TestFastDecodersTakeClientBodies(t *testing.T) {
	for _, b := range []string{
		`{"items":[{"queue":"orders","partition":"42","payload":{"id":1,"name":"ü"},"transactionId":"0192f0c4-2b7e-7cc3-9c1e-2f5d3c7a1b00","traceId":null}]}`,
		`{"items":[{"queue":"q","payload":"x","partition":null,"transactionId":null}]}`,
	} {
		if _, ok := fastPush([]byte(b)); !ok {
			t.Errorf("fast push decoder gave up on %s", b)
		}
	}
	for _, b := range []string{
		`{"consumerGroup":"g","acknowledgments":[{"transactionId":"t","partitionId":"17","leaseId":"l","status":"completed","index":0}]}`,
		`{"acknowledgments":[{"transactionId":"t","partitionId":17,"status":"failed","error":"boom"}],"consumerGroup":null}`,
	} {
		if _, ok := fastAckBatch([]byte(b)); !ok {
			t.Errorf("fast ack decoder gave up on %s", b)
		}
	}
}

// The ack batch a client sends after a pop of 100 decodes in a few
// allocations, not several per ack (its strings share one copy of the
// body), to the items encoding/json gives.
func TestFastAckBatchAllocations(t *testing.T) {
	b := []byte(`{"consumerGroup":"g","acknowledgments":[`)
	for i := 0; i < 100; i++ {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, `{"transactionId":"0192f0c4-2b7e-7cc3-9c1e-2f5d3c7a%04d","partitionId":"%d","offset":%d,"leaseId":"4f1c2b7e-9c1e-4d5c-a2f8-2c2a9ab24bfa","status":"completed"}`, i, 17+i%10, i)
	}
	b = append(b, "]}"...)
	fast, ok := fastAckBatch(b)
	if !ok {
		t.Fatal("the fast ack decoder gave up on a client's batch")
	}
	slow, e := decodeAckBatchSlow(b)
	if e != nil || !reflect.DeepEqual(fast, slow) {
		t.Fatalf("fast and encoding/json differ (%v)", e)
	}
	if n := testing.AllocsPerRun(20, func() { fastAckBatch(b) }); n > 20 {
		t.Fatalf("decoding 100 acks took %.0f allocations; want at most 20", n)
	}
}
