package httpapi

import (
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
			if e.Status != 400 || e.Code == "" {
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
		if _, e := DecodeAck(b); e != nil && e.Status != 400 {
			t.Fatalf("bad error %+v", e)
		}
		if items, e := DecodeAckBatch(b); e != nil {
			if e.Status != 400 {
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
			if e.Status != 400 || e.Code == "" {
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
