package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"github.com/valyala/fastjson"
)

// The consume scenarios against queen: pop and ack, fan-out, and the
// push-to-consumer latency.

type popMessage struct {
	TransactionID string          `json:"transactionId"`
	PartitionID   string          `json:"partitionId"`
	LeaseID       string          `json:"leaseId"`
	Attempt       int             `json:"attempt"`
	Data          json.RawMessage `json:"data"`
}

type popReply struct {
	Success  bool         `json:"success"`
	LeaseID  string       `json:"leaseId"`
	Messages []popMessage `json:"messages"`
}

type ackItem struct {
	Index   int     `json:"index"`
	Success bool    `json:"success"`
	Error   *string `json:"error"`
}

// The consumers decode replies with fastjson, a validating parser without
// reflection: with encoding/json the bench's own decoding took about 40% of
// its CPU in pop+ack, on the same two cores as the server. TestReplyDecoders
// checks that both decoders give the same values.

// decodePopReply parses a pop reply into r, reusing its slices. Data is
// copied only when withData is set (the latency scenario reads it).
func decodePopReply(p *fastjson.Parser, body []byte, r *popReply, withData bool) error {
	v, err := p.ParseBytes(body)
	if err != nil {
		return err
	}
	r.Success = v.GetBool("success")
	r.LeaseID = string(v.GetStringBytes("leaseId"))
	r.Messages = r.Messages[:0]
	var arr []*fastjson.Value
	if mv := v.Get("messages"); mv != nil && mv.Type() != fastjson.TypeNull {
		if arr, err = mv.Array(); err != nil {
			return fmt.Errorf("messages: %w", err)
		}
	}
	for _, m := range arr {
		if m.Type() != fastjson.TypeObject {
			return fmt.Errorf("message is %s, not an object", m.Type())
		}
		pm := popMessage{
			TransactionID: string(m.GetStringBytes("transactionId")),
			PartitionID:   string(m.GetStringBytes("partitionId")),
			LeaseID:       string(m.GetStringBytes("leaseId")),
			Attempt:       m.GetInt("attempt"),
		}
		if withData {
			if d := m.Get("data"); d != nil {
				pm.Data = d.MarshalTo(nil)
			}
		}
		r.Messages = append(r.Messages, pm)
	}
	return nil
}

// decodeAckReply parses an ack/batch reply into acks, reusing the slice.
func decodeAckReply(p *fastjson.Parser, body []byte, acks []ackItem) ([]ackItem, error) {
	v, err := p.ParseBytes(body)
	if err != nil {
		return acks, err
	}
	arr, err := v.Array()
	if err != nil {
		return acks, err
	}
	for _, a := range arr {
		it := ackItem{Index: a.GetInt("index"), Success: a.GetBool("success")}
		if e := a.Get("error"); e != nil && e.Type() == fastjson.TypeString {
			s := string(e.GetStringBytes())
			it.Error = &s
		}
		acks = append(acks, it)
	}
	return acks, nil
}

// queenConsumer: GET pop (batch, partitions, consumerGroup, subscriptionMode=all),
// then one POST /api/v1/ack/batch with status completed for every message.
type queenConsumer struct {
	q       *queenSystem
	base    string
	popPath string
	group   string
	resp    bytes.Buffer
	body    []byte
	reply   popReply
	acks    []ackItem
	parser  fastjson.Parser
	raw     *rawConn // -queen-client raw
}

func (q *queenSystem) newConsumer(queue, group string) *queenConsumer {
	v := url.Values{}
	v.Set("batch", strconv.Itoa(q.cfg.popBatch))
	v.Set("partitions", strconv.Itoa(q.cfg.popPartitions))
	v.Set("consumerGroup", group)
	v.Set("subscriptionMode", "all")
	base := q.nextBase()
	return &queenConsumer{q: q, base: base, group: group, raw: q.newRaw(base),
		popPath: "/api/v1/pop/queue/" + url.PathEscape(queue) + "?" + v.Encode(),
		body:    make([]byte, 0, 64+q.cfg.popBatch*160)}
}

// appendJSONString appends s as a JSON string.
func appendJSONString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			b, _ := json.Marshal(s)
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

func (c *queenConsumer) cycle(ctx context.Context) (int, int, error) {
	q := c.q
	st, err := q.exchange(ctx, c.raw, c.base, http.MethodGet, c.popPath, nil, &c.resp, false)
	if err != nil {
		return 0, 0, q.fail(err)
	}
	if st == http.StatusNoContent {
		return 0, 0, nil
	}
	if st != http.StatusOK {
		return 0, 0, q.fail(&httpError{method: "GET", path: c.popPath, status: st, reply: c.resp.Bytes(), why: "want 200 or 204"})
	}
	if err := decodePopReply(&c.parser, c.resp.Bytes(), &c.reply, false); err != nil {
		return 0, 0, q.fail(&httpError{method: "GET", path: c.popPath, status: st, reply: c.resp.Bytes(), why: "decode: " + err.Error()})
	}
	msgs := c.reply.Messages
	if len(msgs) == 0 {
		return 0, 0, nil
	}
	if err := c.ackAll(ctx, msgs, st); err != nil {
		return 0, 0, err
	}
	redelivered := 0
	for _, m := range msgs {
		if m.Attempt > 1 {
			redelivered++
		}
	}
	return len(msgs), redelivered, nil
}

// ackAll acknowledges msgs of the pop reply in c.reply (completed) and
// checks every entry of the answer. popStatus is the pop's HTTP status, for
// the error of a message that cannot be acknowledged.
func (c *queenConsumer) ackAll(ctx context.Context, msgs []popMessage, popStatus int) error {
	b, err := c.ackBody(c.body[:0], msgs, popStatus)
	if err != nil {
		return err
	}
	c.body = b
	return c.postAck(ctx, b, len(msgs))
}

// ackBody appends to dst the ack/batch request that completes msgs of the
// pop reply in c.reply.
func (c *queenConsumer) ackBody(dst []byte, msgs []popMessage, popStatus int) ([]byte, error) {
	q := c.q
	b := append(dst, '{')
	if c.group != "" {
		b = append(b, `"consumerGroup":`...)
		b = appendJSONString(b, c.group)
		b = append(b, ',')
	}
	b = append(b, `"acknowledgments":[`...)
	for i, m := range msgs {
		if i > 0 {
			b = append(b, ',')
		}
		lease := m.LeaseID
		if lease == "" {
			lease = c.reply.LeaseID
		}
		if m.TransactionID == "" || m.PartitionID == "" || lease == "" {
			return b, q.fail(&httpError{method: "GET", path: c.popPath, status: popStatus, reply: c.resp.Bytes(),
				why: fmt.Sprintf("message %d lacks transactionId, partitionId or leaseId", i)})
		}
		b = append(b, `{"transactionId":`...)
		b = appendJSONString(b, m.TransactionID)
		b = append(b, `,"partitionId":`...)
		b = appendJSONString(b, m.PartitionID)
		b = append(b, `,"leaseId":`...)
		b = appendJSONString(b, lease)
		b = append(b, `,"status":"completed"}`...)
	}
	return append(b, `]}`...), nil
}

// postAck sends the ack/batch request b of n messages and checks that
// every entry of the answer succeeded.
func (c *queenConsumer) postAck(ctx context.Context, b []byte, n int) error {
	q := c.q
	st, err := q.exchange(ctx, c.raw, c.base, http.MethodPost, "/api/v1/ack/batch", b, &c.resp, false)
	if err != nil {
		return q.fail(err)
	}
	if st != http.StatusOK {
		return q.fail(&httpError{method: "POST", path: "/api/v1/ack/batch", reqBody: b, status: st, reply: c.resp.Bytes(), why: "want 200"})
	}
	if c.acks, err = decodeAckReply(&c.parser, c.resp.Bytes(), c.acks[:0]); err != nil {
		return q.fail(&httpError{method: "POST", path: "/api/v1/ack/batch", reqBody: b, status: st, reply: c.resp.Bytes(), why: "decode: " + err.Error()})
	}
	if len(c.acks) != n {
		return q.fail(&httpError{method: "POST", path: "/api/v1/ack/batch", reqBody: b, status: st, reply: c.resp.Bytes(),
			why: fmt.Sprintf("want %d entries, got %d", n, len(c.acks))})
	}
	for _, a := range c.acks {
		if !a.Success {
			e := "<nil>"
			if a.Error != nil {
				e = *a.Error
			}
			return q.fail(&httpError{method: "POST", path: "/api/v1/ack/batch", reqBody: b, status: st, reply: c.resp.Bytes(),
				why: fmt.Sprintf("entry %d not successful (error %s)", a.Index, e)})
		}
	}
	return nil
}

func (c *queenConsumer) close() {
	if c.raw != nil {
		c.raw.close()
	}
}

func (q *queenSystem) popAck(ctx context.Context, sc scenario, m *cpuMeter) result {
	return runConsume(ctx, q.cfg, m, []string{"g" + strconv.Itoa(sc.clients)}, sc.clients, int64(q.cfg.prefill),
		func(g string, _ int) (consumer, error) { return q.newConsumer(q.consQueue, g), nil })
}

func (q *queenSystem) fanOut(ctx context.Context, sc scenario, m *cpuMeter) result {
	return runConsume(ctx, q.cfg, m, fanGroupNames(q.cfg, sc), fanPerGroup(q.cfg, sc), int64(q.cfg.prefill),
		func(g string, _ int) (consumer, error) { return q.newConsumer(q.consQueue, g), nil })
}

// latencyAckers is how many acknowledgements of the latency consumer may
// be waiting for their answers at once.
const latencyAckers = 8

func (q *queenSystem) latency(ctx context.Context, m *cpuMeter) result {
	queue := q.queueName("latency")
	if err := q.configure(ctx, queue); err != nil {
		return result{err: q.fail(err)}
	}
	prefix := fmt.Appendf(nil, `{"items":[{"queue":%q,"partition":"p0","payload":`, queue)
	// -latency-ack explicit: the pop leases, and the batch is acknowledged
	// after its receive times are taken; none: autoAck, whose pop is an
	// acknowledgement and so durable before its reply.
	explicit := q.cfg.latAck == latencyAckExplicit
	popPath := "/api/v1/pop/queue/" + url.PathEscape(queue) + "?batch=100&wait=true&timeout=30000"
	if !explicit {
		popPath += "&autoAck=true"
	}

	startRecv := func(ctx context.Context, onMsg func([]byte)) (func() error, error) {
		done := make(chan error, 1)
		go func() {
			// With several nodes the consumer reads from the last one and
			// the producer writes to the first: the latency crosses nodes.
			recvBase := q.bases[len(q.bases)-1]
			c := &queenConsumer{q: q, base: recvBase, popPath: popPath, raw: q.newRaw(recvBase)}
			defer c.close()
			// Acknowledgements go out while the next pop already waits, each
			// without waiting for the answers to the ones before it (as
			// nats.go's Ack does not wait for the server), on up to
			// latencyAckers connections of their own. An ack releases its
			// batch's lease on the partition and wakes that pop; waiting for
			// each ack's answer (its fsync) before sending the next queued
			// them behind each other whenever one took longer than the gap
			// between messages.
			acks := make(chan []byte)
			var (
				ackWG   sync.WaitGroup
				ackFail firstErr
			)
			if explicit {
				for range latencyAckers {
					a := &queenConsumer{q: q, base: recvBase, popPath: popPath, raw: q.newRaw(recvBase)}
					ackWG.Go(func() {
						defer a.close()
						for b := range acks {
							// Not cancelled with the run: the last batch is acknowledged too.
							ackFail.set(a.postAck(context.WithoutCancel(ctx), b, bytes.Count(b, []byte(`"transactionId"`))))
						}
					})
				}
			}
			finish := func(err error) {
				if explicit {
					close(acks)
					ackWG.Wait()
					if err == nil {
						err = ackFail.err
					}
				}
				done <- err
			}
			// The end of the run cancels the pending pop: not a failure.
			stop := func(err error) {
				if ctx.Err() != nil {
					finish(nil)
					return
				}
				finish(q.fail(err))
			}
			for {
				st, err := q.exchange(ctx, c.raw, c.base, http.MethodGet, c.popPath, nil, &c.resp, true)
				if err != nil {
					stop(err)
					return
				}
				if st == http.StatusNoContent {
					continue
				}
				if st != http.StatusOK {
					stop(&httpError{method: "GET", path: popPath, status: st, reply: c.resp.Bytes(), why: "want 200 or 204"})
					return
				}
				if err := decodePopReply(&c.parser, c.resp.Bytes(), &c.reply, true); err != nil {
					stop(&httpError{method: "GET", path: popPath, status: st, reply: c.resp.Bytes(), why: "decode: " + err.Error()})
					return
				}
				for _, m := range c.reply.Messages {
					onMsg(m.Data)
				}
				if explicit && len(c.reply.Messages) > 0 {
					b, err := c.ackBody(nil, c.reply.Messages, st)
					if err != nil {
						finish(err)
						return
					}
					acks <- b
				}
			}
		}()
		return func() error { return <-done }, nil
	}
	freeRaw := make(chan *rawConn, 64)
	defer func() {
		for {
			select {
			case rc := <-freeRaw:
				rc.close()
			default:
				return
			}
		}
	}()
	send := func(ctx context.Context, payload []byte) error {
		body := make([]byte, 0, len(prefix)+len(payload)+4)
		body = append(body, prefix...)
		body = append(body, payload...)
		body = append(body, `}]}`...)
		var resp bytes.Buffer
		// Sends overlap: each takes a free lean connection, or makes one.
		var rc *rawConn
		select {
		case rc = <-freeRaw:
		default:
			rc = q.newRaw(q.base)
		}
		st, err := q.exchange(ctx, rc, q.base, http.MethodPost, "/api/v1/push", body, &resp, false)
		if rc != nil {
			select {
			case freeRaw <- rc:
			default:
				rc.close()
			}
		}
		if err != nil {
			return q.fail(err)
		}
		if st != http.StatusCreated || !bytes.Contains(resp.Bytes(), queuedMark) {
			return q.fail(&httpError{method: "POST", path: "/api/v1/push", reqBody: body, status: st, reply: resp.Bytes(), why: "want 201 with status \"queued\""})
		}
		return nil
	}
	return runLatency(ctx, q.cfg, m, startRecv, send)
}
