package e2e

import (
	"testing"
)

func TestDLQ(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	const q, q2 = "dlq-main", "dlq-other"
	pushed := s.pushN(t, q, "p", 3)

	// Group gA dead-letters messages 0 and 1 and completes 2.
	for i, status := range []string{"dlq", "dlq", "completed"} {
		m := s.mustPop(t, q, "consumerGroup=gA&subscriptionMode=all", 1).Messages[0]
		if m.ID != pushed[i].MessageID {
			t.Fatalf("gA delivery %d: %s, want %s", i, m.ID, pushed[i].MessageID)
		}
		a := ackFor(m, status)
		a.Error = "bad " + string(rune('0'+i))
		s.mustAck(t, a)
	}
	// Group gB completes everything.
	s.ackAll(t, s.mustPop(t, q, "consumerGroup=gB&subscriptionMode=all&batch=10", 3), "completed")
	// Another queue: gA dead-letters its one message.
	s.pushN(t, q2, "p", 1)
	m2 := s.mustPop(t, q2, "consumerGroup=gA&subscriptionMode=all", 1).Messages[0]
	s.mustAck(t, ackFor(m2, "dlq"))

	t.Run("List", func(t *testing.T) {
		d := s.dlq(t, "queue="+q)
		if d.Total != 2 || len(d.Messages) != 2 {
			t.Fatalf("dlq?queue=%s: want total 2, got %+v", q, d)
		}
		byID := map[string]dlqMessage{}
		for _, m := range d.Messages {
			byID[m.ID] = m
		}
		for i := 0; i < 2; i++ {
			m, ok := byID[pushed[i].MessageID]
			if !ok {
				t.Errorf("dlq lacks message %d (%s)", i, pushed[i].MessageID)
				continue
			}
			if m.ConsumerGroup != "gA" || m.Queue != q || m.Partition != "p" || m.PartitionID != pushed[i].PartitionID ||
				m.Offset != pushed[i].Offset || m.TransactionID != pushed[i].TransactionID || m.ErrorMessage != "bad "+string(rune('0'+i)) {
				t.Errorf("dlq entry %d: %+v", i, m)
			}
			if m.Data["i"] != float64(i) {
				t.Errorf("dlq entry %d data %v", i, m.Data)
			}
			parseAPITime(t, "createdAt", m.CreatedAt)
			parseAPITime(t, "failedAt", m.FailedAt)
		}
		if d := s.dlq(t, "queue="+q+"&consumerGroup=gB"); d.Total != 0 || len(d.Messages) != 0 {
			t.Errorf("dlq of gB: %+v, want empty", d)
		}
		if d := s.dlq(t, "queue="+q+"&consumerGroup=gA"); d.Total != 2 {
			t.Errorf("dlq of gA on %s: total %d, want 2", q, d.Total)
		}
		if d := s.dlq(t, "consumerGroup=gA"); d.Total != 3 {
			t.Errorf("dlq of gA on all queues: total %d, want 3", d.Total)
		}
		if d := s.dlq(t, "queue="+q2); d.Total != 1 || d.Messages[0].ID != m2.ID {
			t.Errorf("dlq of %s: %+v", q2, d)
		}
		page := s.dlq(t, "queue="+q+"&limit=1")
		if page.Total != 2 || len(page.Messages) != 1 {
			t.Errorf("limit=1: %d messages, total %d; want 1 and 2", len(page.Messages), page.Total)
		}
		page2 := s.dlq(t, "queue="+q+"&limit=1&offset=1")
		if page2.Total != 2 || len(page2.Messages) != 1 || page2.Messages[0].ID == page.Messages[0].ID {
			t.Errorf("limit=1&offset=1: %+v (first page %+v)", page2, page)
		}
		if d := s.dlq(t, "queue="+q+"&partition=p"); d.Total != 2 {
			t.Errorf("dlq partition=p: total %d, want 2", d.Total)
		}
		if d := s.dlq(t, "queue="+q+"&partition=zzz"); d.Total != 0 {
			t.Errorf("dlq partition=zzz: total %d, want 0", d.Total)
		}
		if d := s.dlq(t, "queue=dlq-never-existed"); d.Total != 0 {
			t.Errorf("dlq of an unknown queue: %+v", d)
		}
	})

	t.Run("Requeue", func(t *testing.T) {
		s.callJSON(t, "POST", "/api/v1/dlq/requeue", M{"queue": q, "consumerGroup": "gA", "ids": []string{pushed[0].MessageID}}, 200, nil)
		p := s.mustPop(t, q, "consumerGroup=gA&batch=10", 1)
		m := p.Messages[0]
		if m.ID != pushed[0].MessageID || m.PartitionID != pushed[0].PartitionID || m.Offset != pushed[0].Offset || m.TransactionID != pushed[0].TransactionID {
			t.Errorf("requeued message: %+v, want the same message %+v", m, pushed[0])
		}
		s.mustEmpty(t, q, "consumerGroup=gB&batch=10")
		s.mustAck(t, ackFor(m, "completed"))
		s.mustEmpty(t, q, "consumerGroup=gA&batch=10") // message 1 stays dead-lettered
		d := s.dlq(t, "queue="+q+"&consumerGroup=gA")
		if d.Total != 1 || d.Messages[0].ID != pushed[1].MessageID {
			t.Errorf("dlq after requeueing message 0: %+v, want only message 1", d)
		}
	})

	t.Run("Delete", func(t *testing.T) {
		s.callJSON(t, "DELETE", "/api/v1/dlq?queue="+q+"&consumerGroup=gA", nil, 200, nil)
		if d := s.dlq(t, "queue="+q); d.Total != 0 || len(d.Messages) != 0 {
			t.Errorf("dlq after delete: %+v", d)
		}
		if d := s.dlq(t, "queue="+q2); d.Total != 1 {
			t.Errorf("delete of %s's dlq touched %s: %+v", q, q2, d)
		}
		if n := s.queueTotal(t, q); n != 3 {
			t.Errorf("deleting the dlq changed the queue total: %d", n)
		}
	})
}
