package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/queen-mq/queen/internal/broker"
)

type txnOpJSON struct {
	Type *string `json:"type"`
	// push
	Items *[]pushItemJSON `json:"items"`
	// ack
	ackJSON
	// kv.*
	Key       *string         `json:"key"`
	Value     json.RawMessage `json:"value"`
	IfVersion *uint64         `json:"ifVersion"`
	TTLMs     *int64          `json:"ttlMs"`
}

type txnBody struct {
	Operations     *[]txnOpJSON `json:"operations"`
	RequiredLeases []string     `json:"requiredLeases"`
}

// DecodeTransaction parses a transaction body (exported for fuzzing).
func DecodeTransaction(body []byte) (broker.TxnRequest, *broker.Error) {
	var tb txnBody
	var req broker.TxnRequest
	if e := decodeJSON(body, &tb); e != nil {
		return req, e
	}
	if tb.Operations == nil {
		return req, &broker.Error{Code: "invalid_parameter", Field: "operations", Message: "operations is required: an array of operations"}
	}
	req.RequiredLeases = tb.RequiredLeases
	if e := txnPushTotal(*tb.Operations); e != nil {
		return req, e
	}
	for i, o := range *tb.Operations {
		field := fmt.Sprintf("operations[%d]", i)
		if o.Type == nil {
			return req, &broker.Error{Code: "invalid_parameter", Field: field + ".type", Message: "type is required: push, ack, kv.put, kv.delete or kv.check"}
		}
		op := broker.TxnOp{Type: *o.Type, IfVersion: o.IfVersion}
		switch op.Type {
		case broker.OpPush, broker.OpAck, broker.OpKVPut, broker.OpKVDelete, broker.OpKVCheck:
		default:
			return req, &broker.Error{Code: "invalid_parameter", Field: field + ".type", Message: fmt.Sprintf("type must be push, ack, kv.put, kv.delete or kv.check, got %q", op.Type)}
		}
		switch op.Type {
		case broker.OpPush:
			if o.Items == nil {
				return req, &broker.Error{Code: "invalid_parameter", Field: field + ".items", Message: "a push operation needs items"}
			}
			b, _ := json.Marshal(pushBody{Items: o.Items})
			items, e := DecodePush(b)
			if e != nil {
				e.Field = field + "." + e.Field
				return req, e
			}
			op.Items = items
		case broker.OpAck:
			op.Ack = o.ackJSON.item(nil)
		default:
			if o.Key == nil {
				return req, &broker.Error{Code: "invalid_parameter", Field: field + ".key", Message: "key is required"}
			}
			op.Key = *o.Key
			if string(o.Value) != "" {
				op.Value = o.Value
			}
			if o.TTLMs != nil {
				op.TTLMs = *o.TTLMs
			}
		}
		req.Ops = append(req.Ops, op)
	}
	return req, nil
}

// txnPushTotal refuses, before any item is decoded further, a transaction
// that pushes more items in all than one push may hold.
func txnPushTotal(ops []txnOpJSON) *broker.Error {
	total := 0
	for _, o := range ops {
		if o.Items != nil && o.Type != nil && *o.Type == broker.OpPush {
			total += len(*o.Items)
		}
	}
	if total > broker.MaxPushItems {
		return broker.TxnTooManyItems(total)
	}
	return nil
}

func (s *Server) handleTransaction(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	req, e := DecodeTransaction(body)
	if e != nil {
		writeError(w, e)
		return
	}
	req.Tenant = s.tenant(r)
	ctx, cancel := requestContext(r)
	defer cancel()
	out, err := s.b.Transaction(ctx, req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	results := make([]any, len(out))
	for i, o := range out {
		switch o.Type {
		case broker.OpPush:
			items := make([]map[string]any, len(o.Push))
			for j, p := range o.Push {
				st := "queued"
				if p.Duplicate {
					st = "duplicate"
				}
				items[j] = map[string]any{"index": j, "status": st, "transaction_id": p.TxID, "message_id": p.MessageID,
					"partition_id": strconv.FormatUint(p.PartitionID, 10), "offset": p.Offset, "queueName": p.Queue}
			}
			results[i] = map[string]any{"type": o.Type, "items": items}
		case broker.OpAck:
			var errText *string
			if o.Ack.Error != "" {
				e := o.Ack.Error
				errText = &e
			}
			results[i] = map[string]any{"type": o.Type, "transactionId": o.Ack.TxID, "success": o.Ack.Success, "error": errText,
				"leaseReleased": o.Ack.LeaseReleased, "dlq": o.Ack.DLQ}
		case broker.OpKVDelete:
			results[i] = map[string]any{"type": o.Type, "key": o.Key, "deleted": o.Existed}
		default:
			results[i] = map[string]any{"type": o.Type, "key": o.Key, "version": o.Version}
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "results": results})
}

func kvJSON(e broker.KVEntry, withValue bool) map[string]any {
	m := map[string]any{"key": e.Key, "version": e.Version, "expiresAt": nil}
	if e.ExpiresAt != 0 {
		m["expiresAt"] = formatMicros(e.ExpiresAt)
	}
	if withValue {
		m["value"] = json.RawMessage(e.Value)
	}
	return m
}

func (s *Server) handleKVGet(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	ctx, cancel := requestContext(r)
	defer cancel()
	e, ok, err := s.b.KVGet(ctx, s.tenant(r), key)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !ok {
		writeError(w, &broker.Error{Code: "key_not_found", Message: fmt.Sprintf("key %q does not exist (or its TTL passed)", key)})
		return
	}
	writeJSON(w, http.StatusOK, kvJSON(e, true))
}

func (s *Server) handleKVPut(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Value     json.RawMessage `json:"value"`
		IfVersion *uint64         `json:"ifVersion"`
		TTLMs     *int64          `json:"ttlMs"`
	}
	if !s.decode(w, r, &body) {
		return
	}
	key := r.PathValue("key")
	var ttl int64
	if body.TTLMs != nil {
		ttl = *body.TTLMs
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	v, err := s.b.KVPut(ctx, s.tenant(r), key, body.Value, body.IfVersion, ttl, false)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"key": key, "version": v})
}

func (s *Server) handleKVDelete(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	var ifv *uint64
	if v := qStr(r, "ifVersion"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeError(w, &broker.Error{Code: "invalid_parameter", Field: "ifVersion", Message: "ifVersion must be a version number"})
			return
		}
		ifv = &n
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	existed, err := s.b.KVDelete(ctx, s.tenant(r), key, ifv, false)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"key": key, "deleted": existed})
}

func (s *Server) handleKVList(w http.ResponseWriter, r *http.Request) {
	limit, e := qInt(r, "limit", 100, 1, 10000)
	if e != nil {
		writeError(w, e)
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	list, err := s.b.KVList(ctx, s.tenant(r), qStr(r, "prefix"), qStr(r, "after"), int(limit))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	keys := make([]map[string]any, 0, len(list))
	for _, e := range list {
		keys = append(keys, kvJSON(e, true))
	}
	reply := map[string]any{"keys": keys}
	if len(list) == int(limit) {
		reply["nextAfter"] = list[len(list)-1].Key
	}
	writeJSON(w, http.StatusOK, reply)
}
