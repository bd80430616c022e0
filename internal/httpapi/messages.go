package httpapi

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/stagetime"
)

type pushItemJSON struct {
	Queue         *string         `json:"queue"`
	Partition     *string         `json:"partition"`
	Payload       json.RawMessage `json:"payload"`
	TransactionID *string         `json:"transactionId"`
	TraceID       *string         `json:"traceId"`
}

type pushBody struct {
	Items *[]pushItemJSON `json:"items"`
}

// DecodePush parses a push body into broker items (exported for fuzzing).
func DecodePush(body []byte) ([]broker.PushItem, *broker.Error) {
	if items, ok := fastPush(body); ok {
		return items, nil
	}
	return decodePushSlow(body)
}

// decodePushSlow decodes with encoding/json: every body the fast path
// leaves, and every error message.
func decodePushSlow(body []byte) ([]broker.PushItem, *broker.Error) {
	var pb pushBody
	if e := decodeJSON(body, &pb); e != nil {
		return nil, e
	}
	if pb.Items == nil {
		return nil, &broker.Error{Code: "invalid_parameter", Field: "items", Message: "items is required: an array of messages"}
	}
	items := make([]broker.PushItem, len(*pb.Items))
	for i, it := range *pb.Items {
		if it.Queue == nil {
			return nil, &broker.Error{Code: "invalid_parameter", Field: "items[" + strconv.Itoa(i) + "].queue", Message: "queue is required"}
		}
		pi := broker.PushItem{Queue: *it.Queue, Partition: broker.DefaultPartition, Payload: it.Payload}
		if it.Partition != nil {
			pi.Partition = *it.Partition
		}
		if len(pi.Payload) == 0 {
			pi.Payload = []byte("null")
		}
		if it.TransactionID != nil {
			pi.TxID = *it.TransactionID
		}
		if it.TraceID != nil {
			pi.TraceID = *it.TraceID
		}
		items[i] = pi
	}
	return items, nil
}

func (s *Server) handlePush(w http.ResponseWriter, r *http.Request) {
	tr := stagetime.Begin("push")
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	items, e := DecodePush(body)
	if e != nil {
		writeError(w, e)
		return
	}
	tr.Mark(stagetime.Decoded)
	ctx, cancel := requestContext(r)
	defer cancel()
	out, err := s.b.Push(stagetime.With(ctx, tr), s.tenant(r), items)
	if err != nil {
		// The push may still be queued with slices of the body.
		s.fail(w, r, err)
		return
	}
	// The payloads are in the log entry: nothing reads the body again.
	clear(items)
	releaseBody(body)
	tr.Mark(stagetime.Result)
	defer tr.Finish()
	b := replyBuf(160 * len(out))
	b = append(b, '[')
	for i, o := range out {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(o.Index), 10)
		if o.Duplicate {
			b = append(b, `,"status":"duplicate","transaction_id":`...)
		} else {
			b = append(b, `,"status":"queued","transaction_id":`...)
		}
		b = appendString(b, o.TxID)
		b = append(b, `,"message_id":`...)
		b = appendString(b, o.MessageID)
		b = append(b, `,"partition_id":`...)
		b = appendUintString(b, o.PartitionID)
		b = append(b, `,"offset":`...)
		b = strconv.AppendUint(b, o.Offset, 10)
		b = append(b, `,"queueName":`...)
		b = appendString(b, o.Queue)
		b = append(b, '}')
	}
	b = append(b, ']')
	writePooled(w, http.StatusCreated, b)
}

func (s *Server) handlePop(w http.ResponseWriter, r *http.Request) {
	tr := stagetime.Begin("pop")
	req := broker.PopRequest{Tenant: s.tenant(r), Queue: r.PathValue("queue")}
	if p := r.PathValue("partition"); strings.Contains(r.Pattern, "{partition}") {
		req.Partition = &p
	}
	batch, e := qInt(r, "batch", 1, 1, broker.MaxBatch)
	if e != nil {
		writeError(w, e)
		return
	}
	parts, e := qInt(r, "partitions", 1, 1, broker.MaxPartitions)
	if e != nil {
		writeError(w, e)
		return
	}
	lease, e := qInt(r, "leaseSeconds", 0, broker.MinLeaseSeconds, broker.MaxLeaseSeconds)
	if e != nil {
		writeError(w, e)
		return
	}
	timeout, e := qInt(r, "timeout", 30000, 1, broker.MaxTimeoutMs)
	if e != nil {
		writeError(w, e)
		return
	}
	autoAck, e := qBool(r, "autoAck")
	if e != nil {
		writeError(w, e)
		return
	}
	wait, e := qBool(r, "wait")
	if e != nil {
		writeError(w, e)
		return
	}
	req.Batch, req.Partitions, req.LeaseSeconds, req.AutoAck, req.Wait = int(batch), int(parts), lease, autoAck, wait
	req.Timeout = time.Duration(timeout) * time.Millisecond
	req.Group = qStr(r, "consumerGroup")
	req.SubscriptionMode = qStr(r, "subscriptionMode")
	req.SubscriptionFrom = qStr(r, "subscriptionFrom")
	tr.Mark(stagetime.Decoded)
	ctx := r.Context()
	if !wait {
		var cancel func()
		ctx, cancel = requestContext(r)
		defer cancel()
	}
	resp, err := s.b.Pop(stagetime.With(ctx, tr), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	tr.Mark(stagetime.Result)
	if tr != nil && len(resp.Messages) > 0 {
		tr.Tag = resp.Messages[0].ID
	}
	defer tr.Finish()
	if len(resp.Messages) == 0 {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	size := 256
	for _, m := range resp.Messages {
		size += 400 + len(m.Data) + len(m.Partition)
	}
	writePooled(w, http.StatusOK, appendPopReply(replyBuf(size), resp))
}

// appendPopReply writes a pop's reply by hand. The strings most messages
// repeat (queue, partition, lease, group) are escaped once per run of equal
// values, not once per message. TestPopReplyEncoding compares it with
// encoding/json.
func appendPopReply(b []byte, resp *broker.PopResponse) []byte {
	b = append(b, `{"success":true,"queue":`...)
	b = appendString(b, resp.Queue)
	b = append(b, `,"consumerGroup":`...)
	b = appendString(b, resp.Group)
	b = append(b, `,"leaseId":`...)
	b = appendString(b, resp.LeaseID)
	b = append(b, `,"partitionsClaimed":`...)
	b = strconv.AppendInt(b, int64(resp.Claimed), 10)
	b = append(b, `,"messages":[`...)
	var queue, part, lease, group escaped
	for i := range resp.Messages {
		m := &resp.Messages[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = appendString(b, m.ID)
		b = append(b, `,"transactionId":`...)
		b = appendString(b, m.TxID)
		b = append(b, `,"traceId":`...)
		b = appendNullableString(b, m.TraceID)
		b = append(b, `,"queue":`...)
		b = queue.append(b, m.Queue)
		b = append(b, `,"partition":`...)
		b = part.append(b, m.Partition)
		b = append(b, `,"partitionId":`...)
		b = appendUintString(b, m.PartitionID)
		b = append(b, `,"offset":`...)
		b = strconv.AppendUint(b, m.Offset, 10)
		b = append(b, `,"createdAt":`...)
		b = appendTime(b, m.CreatedAt)
		b = append(b, `,"data":`...)
		b = append(b, m.Data...)
		b = append(b, `,"leaseId":`...)
		b = lease.append(b, m.LeaseID)
		b = append(b, `,"consumerGroup":`...)
		b = group.append(b, m.Group)
		b = append(b, `,"attempt":`...)
		b = strconv.AppendUint(b, uint64(m.Attempt), 10)
		b = append(b, `,"retryCount":`...)
		b = strconv.AppendUint(b, uint64(m.Retries), 10)
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// escaped appends a string as JSON, escaping it only when it differs from
// the one before.
type escaped struct {
	s   string
	enc []byte
	set bool
}

func (e *escaped) append(b []byte, s string) []byte {
	if !e.set || s != e.s {
		e.s, e.set = s, true
		e.enc = appendString(e.enc[:0], s)
	}
	return append(b, e.enc...)
}

type ackJSON struct {
	TransactionID *string  `json:"transactionId"`
	PartitionID   idValue  `json:"partitionId"`
	Offset        *uint64  `json:"offset"`
	Status        *string  `json:"status"`
	ConsumerGroup *string  `json:"consumerGroup"`
	LeaseID       *string  `json:"leaseId"`
	Error         *string  `json:"error"`
	Index         *float64 `json:"index"`
}

type ackBatchBody struct {
	ConsumerGroup   *string    `json:"consumerGroup"`
	Acknowledgments *[]ackJSON `json:"acknowledgments"`
}

func (a *ackJSON) item(group *string) broker.AckItem {
	it := broker.AckItem{PartitionID: a.PartitionID.v, Offset: a.Offset}
	if a.TransactionID != nil {
		it.TxID = *a.TransactionID
	}
	if a.Status != nil {
		it.Status = *a.Status
	}
	if a.ConsumerGroup != nil {
		it.Group = *a.ConsumerGroup
	} else if group != nil {
		it.Group = *group
	}
	if group != nil && *group != "" {
		it.Group = *group
	}
	if a.LeaseID != nil {
		it.LeaseID = *a.LeaseID
	}
	if a.Error != nil {
		it.Error = *a.Error
	}
	return it
}

// DecodeAckBatch parses an /ack/batch body (exported for fuzzing).
func DecodeAckBatch(body []byte) ([]broker.AckItem, *broker.Error) {
	if items, ok := fastAckBatch(body); ok {
		return items, nil
	}
	return decodeAckBatchSlow(body)
}

func decodeAckBatchSlow(body []byte) ([]broker.AckItem, *broker.Error) {
	var ab ackBatchBody
	if e := decodeJSON(body, &ab); e != nil {
		return nil, e
	}
	if ab.Acknowledgments == nil {
		return nil, &broker.Error{Code: "invalid_parameter", Field: "acknowledgments", Message: "acknowledgments is required: an array of acks"}
	}
	items := make([]broker.AckItem, len(*ab.Acknowledgments))
	for i := range *ab.Acknowledgments {
		items[i] = (*ab.Acknowledgments)[i].item(ab.ConsumerGroup)
	}
	return items, nil
}

// DecodeAck parses a single /ack body (exported for fuzzing).
func DecodeAck(body []byte) (broker.AckItem, *broker.Error) {
	var a ackJSON
	if e := decodeJSON(body, &a); e != nil {
		return broker.AckItem{}, e
	}
	return a.item(nil), nil
}

func (s *Server) handleAck(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	it, e := DecodeAck(body)
	if e != nil {
		writeError(w, e)
		return
	}
	s.ack(w, r, []broker.AckItem{it}, nil)
}

func (s *Server) handleAckBatch(w http.ResponseWriter, r *http.Request) {
	tr := stagetime.Begin("ack")
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	items, e := DecodeAckBatch(body)
	if e != nil {
		writeError(w, e)
		return
	}
	tr.Mark(stagetime.Decoded)
	s.ack(w, r, items, tr)
}

// ack answers an acknowledgement; tr times it (nil: not timed).
func (s *Server) ack(w http.ResponseWriter, r *http.Request, items []broker.AckItem, tr *stagetime.Trace) {
	ctx, cancel := requestContext(r)
	defer cancel()
	out, err := s.b.Ack(stagetime.With(ctx, tr), s.tenant(r), items)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	tr.Mark(stagetime.Result)
	defer tr.Finish()
	writePooled(w, http.StatusOK, appendAckReply(replyBuf(96*len(out)+2), out))
}

// appendAckReply writes the ack reply array by hand: index,
// transactionId, success, error (null when none), leaseReleased, dlq.
// TestAckReplyEncoding compares it with encoding/json.
func appendAckReply(b []byte, out []broker.AckOutcome) []byte {
	b = append(b, '[')
	for i, o := range out {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, `,"transactionId":`...)
		b = appendString(b, o.TxID)
		b = append(b, `,"success":`...)
		b = strconv.AppendBool(b, o.Success)
		b = append(b, `,"error":`...)
		b = appendNullableString(b, o.Error)
		b = append(b, `,"leaseReleased":`...)
		b = strconv.AppendBool(b, o.LeaseReleased)
		b = append(b, `,"dlq":`...)
		b = strconv.AppendBool(b, o.DLQ)
		b = append(b, '}')
	}
	return append(b, ']')
}

func (s *Server) handleExtend(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Seconds *int64 `json:"seconds"`
	}
	if r.ContentLength != 0 {
		if !s.decode(w, r, &body) {
			return
		}
	}
	var secs int64
	if body.Seconds != nil {
		secs = *body.Seconds
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	leaseID := r.PathValue("leaseId")
	out, err := s.b.ExtendLease(ctx, s.tenant(r), leaseID, secs)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	reply := map[string]any{"leaseId": leaseID, "success": out.Success}
	if out.Success {
		reply["expiresAt"] = formatTime(out.ExpiresAt)
	} else {
		reply["error"] = out.Error
	}
	writeJSON(w, http.StatusOK, []any{reply})
}

func (s *Server) handleDLQList(w http.ResponseWriter, r *http.Request) {
	limit, e := qInt(r, "limit", 100, 1, 10000)
	if e != nil {
		writeError(w, e)
		return
	}
	offset, e := qInt(r, "offset", 0, 0, 1<<40)
	if e != nil {
		writeError(w, e)
		return
	}
	queue, group := qStr(r, "queue"), qStr(r, "consumerGroup")
	if e := validDLQFilter(queue, group); e != nil {
		writeError(w, e)
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	list, total, err := s.b.DLQ(ctx, s.tenant(r), queue, group, qStr(r, "partition"), int(limit), int(offset))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	type dlqMsg struct {
		ID            string          `json:"id"`
		TransactionID string          `json:"transactionId"`
		Queue         string          `json:"queue"`
		Partition     string          `json:"partition"`
		PartitionID   string          `json:"partitionId"`
		Offset        uint64          `json:"offset"`
		ConsumerGroup string          `json:"consumerGroup"`
		ErrorMessage  string          `json:"errorMessage"`
		Attempts      uint32          `json:"attempts"`
		Data          json.RawMessage `json:"data"`
		CreatedAt     string          `json:"createdAt"`
		FailedAt      string          `json:"failedAt"`
	}
	msgs := make([]dlqMsg, 0, len(list))
	for _, d := range list {
		data := json.RawMessage(d.Payload)
		if len(data) == 0 || d.Sealed {
			data = json.RawMessage("null")
		}
		msgs = append(msgs, dlqMsg{ID: broker.MessageID(d.PartitionID, d.Offset), TransactionID: d.TxID, Queue: d.Queue, Partition: d.Partition,
			PartitionID: strconv.FormatUint(d.PartitionID, 10), Offset: d.Offset, ConsumerGroup: d.Group, ErrorMessage: d.Error,
			Attempts: d.Attempts, Data: data, CreatedAt: formatMicros(d.CreatedAt), FailedAt: formatMicros(d.FailedAt)})
	}
	writeJSON(w, http.StatusOK, map[string]any{"messages": msgs, "total": total})
}

func (s *Server) handleDLQRequeue(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Queue         *string   `json:"queue"`
		ConsumerGroup *string   `json:"consumerGroup"`
		IDs           *[]string `json:"ids"`
	}
	if !s.decode(w, r, &body) {
		return
	}
	if body.Queue == nil || body.IDs == nil {
		writeError(w, &broker.Error{Code: "invalid_parameter", Field: "queue", Message: "queue and ids are required"})
		return
	}
	group := ""
	if body.ConsumerGroup != nil {
		group = *body.ConsumerGroup
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	n, err := s.b.RequeueDLQ(ctx, s.tenant(r), *body.Queue, group, *body.IDs)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "requeued": n})
}

func (s *Server) handleDLQDelete(w http.ResponseWriter, r *http.Request) {
	queue, group := qStr(r, "queue"), qStr(r, "consumerGroup")
	if e := validDLQFilter(queue, group); e != nil {
		writeError(w, e)
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	n, err := s.b.DeleteDLQ(ctx, s.tenant(r), queue, group)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "deleted": n})
}

// validDLQFilter checks the optional queue and consumerGroup of the DLQ
// routes: a name no queue or group can have is an error, not an empty list.
func validDLQFilter(queue, group string) *broker.Error {
	if queue != "" {
		if e := broker.ValidName("queue", queue); e != nil {
			return e
		}
	}
	if group != "" {
		if e := broker.ValidName("consumerGroup", group); e != nil {
			return e
		}
	}
	return nil
}
