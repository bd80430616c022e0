package e2e

import (
	"fmt"
	"testing"
	"time"
)

type dlqMessage struct {
	ID            string         `json:"id"`
	TransactionID string         `json:"transactionId"`
	Queue         string         `json:"queue"`
	Partition     string         `json:"partition"`
	PartitionID   string         `json:"partitionId"`
	Offset        int64          `json:"offset"`
	ConsumerGroup string         `json:"consumerGroup"`
	ErrorMessage  string         `json:"errorMessage"`
	Attempts      int            `json:"attempts"`
	Data          map[string]any `json:"data"`
	CreatedAt     string         `json:"createdAt"`
	FailedAt      string         `json:"failedAt"`
}

type dlqList struct {
	Messages []dlqMessage `json:"messages"`
	Total    int          `json:"total"`
}

func (s *server) dlq(t testing.TB, query string) dlqList {
	t.Helper()
	var out dlqList
	r := s.callJSON(t, "GET", "/api/v1/dlq?"+query, nil, 200, &out)
	if out.Messages == nil {
		t.Fatalf("dlq list without a messages array:\n%s", r)
	}
	return out
}

func (s *server) configure(t testing.TB, body M) map[string]any {
	t.Helper()
	var out struct {
		Configured bool           `json:"configured"`
		Queue      string         `json:"queue"`
		Options    map[string]any `json:"options"`
	}
	r := s.callJSON(t, "POST", "/api/v1/configure", body, 200, &out)
	if !out.Configured || out.Queue != body["queue"] || out.Options == nil {
		t.Fatalf("configure: want configured true, the queue and its options:\n%s", r)
	}
	return out.Options
}

func TestAck(t *testing.T) {
	t.Parallel()
	s := startServer(t)

	t.Run("Completed", func(t *testing.T) {
		t.Parallel()
		q := "ack-completed"
		s.pushN(t, q, "p", 3)
		p := s.mustPop(t, q, "batch=2", 2)
		r0 := s.mustAck(t, ackFor(p.Messages[0], "completed"))
		if r0.LeaseReleased || r0.Error != nil || r0.TransactionID != p.Messages[0].TransactionID || r0.DLQ {
			t.Errorf("ack 1 of 2: %+v (error %s); want leaseReleased false, error null, the transactionId, dlq false", r0, r0.errText())
		}
		s.mustEmpty(t, q, "")                                // the partition is still leased
		r1 := s.mustAck(t, ackFor(p.Messages[1], "success")) // "success" means completed
		if !r1.LeaseReleased {
			t.Errorf("ack 2 of 2: leaseReleased false, want true")
		}
		m := s.mustPop(t, q, "", 1).Messages[0]
		if dataInts(t, []message{m})[0] != 2 {
			t.Errorf("after completing 0 and 1: got %s, want message 2", m.Data)
		}
		qi, _ := s.queueInfo(t, q)
		if qi.Messages.Pending != 1 || qi.Messages.Total != 3 {
			t.Errorf("queue counts: %+v, want total 3, pending 1", qi.Messages)
		}
	})

	t.Run("FailedThenDLQ", func(t *testing.T) {
		t.Parallel()
		q := "ack-failed"
		s.configure(t, M{"queue": q, "options": M{"retryLimit": 2}})
		pushed := s.pushN(t, q, "p", 2)
		// retryLimit 2: delivered, failed 3 times (retryLimit+1), then dead-lettered.
		for i := 1; i <= 3; i++ {
			m := s.mustPop(t, q, "", 1).Messages[0]
			if m.ID != pushed[0].MessageID || m.Attempt != i || m.RetryCount != i-1 {
				t.Fatalf("delivery %d: got %s attempt %d retryCount %d; want %s attempt %d retryCount %d",
					i, m.ID, m.Attempt, m.RetryCount, pushed[0].MessageID, i, i-1)
			}
			a := ackFor(m, "failed")
			a.Error = fmt.Sprintf("boom %d", i)
			r := s.mustAck(t, a)
			if r.DLQ != (i == 3) {
				t.Errorf("failed ack %d: dlq %v, want %v", i, r.DLQ, i == 3)
			}
		}
		// The partition carries on with the next message.
		m := s.mustPop(t, q, "", 1).Messages[0]
		if m.ID != pushed[1].MessageID || m.Attempt != 1 {
			t.Errorf("after dead-lettering message 0: got %s attempt %d, want %s attempt 1", m.ID, m.Attempt, pushed[1].MessageID)
		}
		d := s.dlq(t, "queue="+q)
		if d.Total != 1 || len(d.Messages) != 1 {
			t.Fatalf("dlq: want the one message, got %+v", d)
		}
		dm := d.Messages[0]
		if dm.ID != pushed[0].MessageID || dm.ErrorMessage != "boom 3" || dm.Queue != q || dm.Partition != "p" ||
			dm.PartitionID != pushed[0].PartitionID || dm.Offset != pushed[0].Offset || dm.TransactionID != pushed[0].TransactionID {
			t.Errorf("dlq entry %+v; want message %+v with errorMessage \"boom 3\"", dm, pushed[0])
		}
		if dm.Attempts != 3 {
			t.Errorf("dlq entry attempts %d, want 3", dm.Attempts)
		}
		if dm.Data["i"] != float64(0) {
			t.Errorf("dlq entry data %v, want {\"i\":0}", dm.Data)
		}
		parseAPITime(t, "dlq createdAt", dm.CreatedAt)
		parseAPITime(t, "dlq failedAt", dm.FailedAt)
	})

	t.Run("RetryDoesNotCountTowardLimit", func(t *testing.T) {
		t.Parallel()
		q := "ack-retry"
		s.configure(t, M{"queue": q, "options": M{"retryLimit": 0}})
		pushed := s.pushN(t, q, "p", 2)
		for i := 0; i < 4; i++ {
			m := s.mustPop(t, q, "", 1).Messages[0]
			if m.ID != pushed[0].MessageID || m.RetryCount != 0 {
				t.Fatalf("retry round %d: got %s retryCount %d; want %s retryCount 0", i, m.ID, m.RetryCount, pushed[0].MessageID)
			}
			if r := s.mustAck(t, ackFor(m, "retry")); r.DLQ {
				t.Fatalf("retry ack dead-lettered the message")
			}
		}
		m := s.mustPop(t, q, "", 1).Messages[0]
		if r := s.mustAck(t, ackFor(m, "failed")); !r.DLQ {
			t.Errorf("retryLimit 0: the first failed ack should dead-letter; dlq=false")
		}
		if n := s.mustPop(t, q, "", 1).Messages[0]; n.ID != pushed[1].MessageID {
			t.Errorf("next: %s, want %s", n.ID, pushed[1].MessageID)
		}
	})

	t.Run("StraightToDLQ", func(t *testing.T) {
		t.Parallel()
		q := "ack-dlq"
		pushed := s.pushN(t, q, "p", 2)
		m := s.mustPop(t, q, "", 1).Messages[0]
		a := ackFor(m, "dlq")
		a.Error = "poison message"
		if r := s.mustAck(t, a); !r.DLQ {
			t.Errorf("status dlq: reply dlq false")
		}
		if n := s.mustPop(t, q, "", 1).Messages[0]; n.ID != pushed[1].MessageID {
			t.Errorf("after dlq: got %s, want %s", n.ID, pushed[1].MessageID)
		}
		d := s.dlq(t, "queue="+q)
		if d.Total != 1 || d.Messages[0].ID != m.ID || d.Messages[0].ErrorMessage != "poison message" {
			t.Errorf("dlq: %+v", d)
		}
	})

	t.Run("WrongLease", func(t *testing.T) {
		t.Parallel()
		q := "ack-wrong-lease"
		s.pushN(t, q, "p", 2)
		p := s.mustPop(t, q, "batch=2", 2)
		before, _ := s.queueInfo(t, q)
		for _, status := range []string{"completed", "failed", "retry", "dlq"} {
			for _, lease := range []string{"not-a-lease", "0190b6a0-0000-7000-8000-000000000000"} {
				a := ackFor(p.Messages[0], status)
				a.LeaseID = lease
				r := s.ack(t, a)
				if r.Success || r.errText() != "lease_expired" {
					t.Errorf("ack %s with leaseId %q: want success false, error lease_expired; got %+v (%s)", status, lease, r, r.errText())
				}
			}
		}
		// In a batch, only the bad item fails.
		bad := ackFor(p.Messages[1], "completed")
		bad.LeaseID = "not-a-lease"
		res := s.ackBatch(t, "", []ackReq{bad})
		if res[0].Success || res[0].errText() != "lease_expired" {
			t.Errorf("batch item with a wrong lease: %+v (%s)", res[0], res[0].errText())
		}
		after, _ := s.queueInfo(t, q)
		if after.Messages != before.Messages {
			t.Errorf("refused acks changed the queue: %+v → %+v", before.Messages, after.Messages)
		}
		if d := s.dlq(t, "queue="+q); d.Total != 0 {
			t.Errorf("refused dlq ack dead-lettered: %+v", d)
		}
		s.mustEmpty(t, q, "") // still leased
		// The real lease still works and the messages are first-time.
		res = s.ackBatch(t, "", []ackReq{ackFor(p.Messages[0], "completed"), ackFor(p.Messages[1], "retry")})
		if !res[0].Success || !res[1].Success {
			t.Fatalf("acks under the real lease: %+v", res)
		}
		m := s.mustPop(t, q, "", 1).Messages[0]
		if m.ID != p.Messages[1].ID || m.RetryCount != 0 {
			t.Errorf("after refused acks: got %s retryCount %d, want %s retryCount 0", m.ID, m.RetryCount, p.Messages[1].ID)
		}
	})

	t.Run("AckFiveNotFour", func(t *testing.T) {
		t.Parallel()
		q := "ack-five-not-four"
		s.pushN(t, q, "p", 6)
		p := s.mustPop(t, q, "batch=6", 6)
		// Name message 5 by offset instead of transactionId.
		off := p.Messages[5].Offset
		a5 := ackReq{PartitionID: p.Messages[5].PartitionID, Offset: &off, Status: "completed", LeaseID: p.LeaseID}
		if r := s.mustAck(t, a5); r.LeaseReleased {
			t.Errorf("ack of the last message only released the lease")
		}
		if qi, _ := s.queueInfo(t, q); qi.Messages.Pending != 5 {
			t.Errorf("after acknowledging message 5 only: pending %d, want 5 (0-4 are not acknowledged)", qi.Messages.Pending)
		}
		var acks []ackReq
		for _, m := range p.Messages[:4] {
			acks = append(acks, ackFor(m, "completed"))
		}
		acks = append(acks, ackFor(p.Messages[4], "retry"))
		res := s.ackBatch(t, "", acks)
		for i, r := range res {
			if !r.Success {
				t.Fatalf("ack %d: %s", i, r.errText())
			}
		}
		if !res[len(res)-1].LeaseReleased {
			t.Errorf("acking the rest of the batch: last item leaseReleased false")
		}
		p2 := s.mustPop(t, q, "batch=10", 1)
		if p2.Messages[0].ID != p.Messages[4].ID {
			t.Errorf("after retry of 4: got %s (offset %d), want message 4", p2.Messages[0].ID, p2.Messages[0].Offset)
		}
		s.ackAll(t, p2, "completed")
		s.mustEmpty(t, q, "batch=10")
	})

	t.Run("BatchReleasesLease", func(t *testing.T) {
		t.Parallel()
		q := "ack-batch"
		s.pushN(t, q, "p", 4)
		p := s.mustPop(t, q, "batch=3&consumerGroup=bg&subscriptionMode=all", 3)
		// The top-level consumerGroup applies to items naming none.
		var acks []ackReq
		for _, m := range p.Messages {
			a := ackFor(m, "completed")
			a.ConsumerGroup = ""
			acks = append(acks, a)
		}
		first := s.ackBatch(t, "bg", acks[:1])
		if !first[0].Success || first[0].LeaseReleased {
			t.Errorf("ack 1 of 3: %+v (%s)", first[0], first[0].errText())
		}
		rest := s.ackBatch(t, "bg", acks[1:])
		if !rest[0].Success || !rest[1].Success || !rest[1].LeaseReleased {
			t.Errorf("acking the rest: %+v; want success and leaseReleased on the last", rest)
		}
		for i, r := range rest {
			if r.Index != i {
				t.Errorf("ack/batch result %d has index %d", i, r.Index)
			}
		}
		m := s.mustPop(t, q, "consumerGroup=bg", 1).Messages[0]
		if dataInts(t, []message{m})[0] != 3 {
			t.Errorf("next: %s, want message 3", m.Data)
		}
		// The queue-mode view is untouched by group bg's acks.
		s.mustPop(t, q, "batch=10", 4)
	})

	t.Run("RetryDelay", func(t *testing.T) {
		t.Parallel()
		q := "ack-retry-delay"
		opts := s.configure(t, M{"queue": q, "options": M{"retryDelay": 1500}})
		if opts["retryDelay"] != float64(1500) {
			t.Fatalf("configure echo retryDelay %v", opts["retryDelay"])
		}
		s.pushN(t, q, "p", 1)
		m := s.mustPop(t, q, "", 1).Messages[0]
		sent := time.Now()
		s.mustAck(t, ackFor(m, "failed"))
		s.mustEmpty(t, q, "")
		var again *popReply
		if err := checkFor(10*time.Second, 25*time.Millisecond, func() error {
			if again = s.pop(t, q, ""); again == nil {
				return fmt.Errorf("not redelivered %v after the failed ack", time.Since(sent))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		el := time.Since(sent)
		if el < 1450*time.Millisecond {
			t.Errorf("retryDelay 1500 ms: redelivered after %v", el)
		}
		if again.Messages[0].ID != m.ID || again.Messages[0].RetryCount != 1 {
			t.Errorf("redelivered %s retryCount %d, want %s retryCount 1", again.Messages[0].ID, again.Messages[0].RetryCount, m.ID)
		}
		t.Logf("redelivered %v after the failed ack (retryDelay 1500 ms)", el.Round(time.Millisecond))
	})

	t.Run("UnknownMessage", func(t *testing.T) {
		t.Parallel()
		q := "ack-unknown"
		s.pushN(t, q, "p", 1)
		p := s.mustPop(t, q, "", 1)
		a := ackFor(p.Messages[0], "completed")
		a.TransactionID = "no-such-transaction"
		if r := s.ack(t, a); r.Success {
			t.Errorf("ack of an unknown transactionId succeeded")
		}
		s.mustEmpty(t, q, "")
		if r := s.mustAck(t, ackFor(p.Messages[0], "completed")); !r.LeaseReleased {
			t.Errorf("real ack after a refused one: leaseReleased false")
		}
	})
}
