package e2e

import (
	"fmt"
	"net/url"
	"testing"
	"time"
)

func TestPop(t *testing.T) {
	t.Parallel()
	s := startServer(t)

	t.Run("BothRoutes", func(t *testing.T) {
		t.Parallel()
		q := "pop-routes"
		s.pushN(t, q, "a", 3)
		s.pushN(t, q, "b", 2)
		p := s.popPartition(t, q, "b", "batch=10")
		if p == nil || len(p.Messages) != 2 {
			t.Fatalf("single-partition route: want the 2 messages of b, got %+v", p)
		}
		for _, m := range p.Messages {
			if m.Partition != "b" || m.Queue != q {
				t.Errorf("single-partition route returned %q/%q", m.Queue, m.Partition)
			}
		}
		if p.Queue != q || p.LeaseID == "" || p.Messages[0].LeaseID != p.LeaseID {
			t.Errorf("reply queue %q leaseId %q, message leaseId %q", p.Queue, p.LeaseID, p.Messages[0].LeaseID)
		}
		if !intsEqual(dataInts(t, p.Messages), []int{0, 1}) {
			t.Errorf("partition b in offset order: got %v", dataInts(t, p.Messages))
		}
		// b is leased: the route for b has nothing more; the queue route gives a.
		if pb := s.popPartition(t, q, "b", "batch=10"); pb != nil {
			t.Errorf("partition b is leased, yet got %d messages", len(pb.Messages))
		}
		pa := s.mustPop(t, q, "batch=10", 3)
		for _, m := range pa.Messages {
			if m.Partition != "a" {
				t.Errorf("queue route: got partition %q, want a (b is leased)", m.Partition)
			}
		}
		for _, m := range append(p.Messages, pa.Messages...) {
			parseAPITime(t, "createdAt", m.CreatedAt)
			if m.Attempt != 1 || m.RetryCount != 0 {
				t.Errorf("first delivery: attempt %d retryCount %d, want 1 and 0", m.Attempt, m.RetryCount)
			}
		}
		// partitions is ignored on the single-partition route.
		s.pushN(t, q, "c", 2)
		if pc := s.popPartition(t, q, "c", "batch=10&partitions=5"); pc == nil || len(pc.Messages) != 2 || distinctPartitions(pc.Messages) != 1 {
			t.Errorf("single-partition route with partitions=5: %+v", pc)
		}
		// Popping a partition that does not exist is 204.
		if pn := s.popPartition(t, q, "nope", ""); pn != nil {
			t.Errorf("unknown partition: got %d messages", len(pn.Messages))
		}
	})

	t.Run("BatchLimit", func(t *testing.T) {
		t.Parallel()
		q := "pop-batch"
		s.pushN(t, q, "p", 10)
		p := s.mustPop(t, q, "batch=3", 3)
		if !intsEqual(dataInts(t, p.Messages), []int{0, 1, 2}) {
			t.Errorf("batch=3: got %v, want 0,1,2", dataInts(t, p.Messages))
		}
		for i := 1; i < len(p.Messages); i++ {
			if p.Messages[i].Offset != p.Messages[i-1].Offset+1 {
				t.Errorf("offsets not consecutive: %v", offsets(p.Messages))
			}
		}
		s.ackAll(t, p, "completed")
		p = s.mustPop(t, q, "batch=1", 1)
		if dataInts(t, p.Messages)[0] != 3 {
			t.Errorf("default-sized next pop: got %v, want 3", dataInts(t, p.Messages))
		}
		s.ackAll(t, p, "completed")
		p = s.mustPop(t, q, "batch=100", 6)
		if !intsEqual(dataInts(t, p.Messages), seq(4, 10)) {
			t.Errorf("rest: got %v", dataInts(t, p.Messages))
		}
	})

	t.Run("DefaultBatchIsOne", func(t *testing.T) {
		t.Parallel()
		q := "pop-batch-default"
		s.pushN(t, q, "p", 3)
		s.mustPop(t, q, "", 1)
	})

	t.Run("PartitionsLimit", func(t *testing.T) {
		t.Parallel()
		q := "pop-parts"
		for i := 0; i < 5; i++ {
			s.pushN(t, q, fmt.Sprintf("p%d", i), 3)
		}
		p := s.mustPop(t, q, "batch=100&partitions=2", 6)
		if n := distinctPartitions(p.Messages); n != 2 {
			t.Errorf("partitions=2: messages from %d partitions", n)
		}
		if p.PartitionsClaimed != 2 {
			t.Errorf("partitionsClaimed %d, want 2", p.PartitionsClaimed)
		}
		// Default partitions=1.
		p1 := s.mustPop(t, q, "batch=100", 3)
		if n := distinctPartitions(p1.Messages); n != 1 || p1.PartitionsClaimed != 1 {
			t.Errorf("default partitions: %d partitions, claimed %d; want 1", n, p1.PartitionsClaimed)
		}
		// batch bounds the total across partitions.
		p2 := s.mustPop(t, q, "batch=4&partitions=10", 4)
		if n := distinctPartitions(p2.Messages); n != 2 {
			t.Errorf("batch=4 partitions=10 over partitions of 3: %d partitions, want 2", n)
		}
		// Within each partition, offset order.
		last := map[string]int64{}
		for _, m := range append(append(p.Messages, p1.Messages...), p2.Messages...) {
			if l, ok := last[m.PartitionID]; ok && m.Offset <= l {
				t.Errorf("partition %s: offset %d after %d", m.Partition, m.Offset, l)
			}
			last[m.PartitionID] = m.Offset
		}
	})

	t.Run("EmptyIs204", func(t *testing.T) {
		t.Parallel()
		s.mustEmpty(t, "pop-never-pushed", "")
		s.mustEmpty(t, "pop-never-pushed", "consumerGroup=g&batch=10")
		q := "pop-drained"
		s.pushN(t, q, "p", 1)
		s.ackAll(t, s.mustPop(t, q, "", 1), "completed")
		s.mustEmpty(t, q, "")
		s.mustEmpty(t, q, "batch=10&partitions=5")
		if p := s.popPartition(t, q, "p", ""); p != nil {
			t.Errorf("drained partition route: got %d messages", len(p.Messages))
		}
	})

	t.Run("QueueModeOneConsumerEach", func(t *testing.T) {
		t.Parallel()
		q := "pop-queue-mode"
		for i := 0; i < 10; i++ {
			s.push(t, []pushItem{{Queue: q, Partition: fmt.Sprintf("p%d", i), Payload: M{"i": i}}})
		}
		got := map[int]bool{}
		for i := 0; i < 10; i++ {
			p := s.mustPop(t, q, "", 1)
			k := dataInts(t, p.Messages)[0]
			if got[k] {
				t.Fatalf("message %d handed out twice in queue mode", k)
			}
			got[k] = true
		}
		s.mustEmpty(t, q, "")
	})

	t.Run("ConsumerGroupsEachGetAll", func(t *testing.T) {
		t.Parallel()
		q := "pop-groups"
		for i := 0; i < 3; i++ {
			s.push(t, []pushItem{{Queue: q, Partition: fmt.Sprintf("p%d", i), Payload: M{"i": 2 * i}}, {Queue: q, Partition: fmt.Sprintf("p%d", i), Payload: M{"i": 2*i + 1}}})
		}
		for _, g := range []string{"g1", "g2", ""} {
			query := "batch=100&partitions=10&subscriptionMode=all"
			if g != "" {
				query += "&consumerGroup=" + g
			}
			p := s.mustPop(t, q, query, 6)
			seen := map[int]bool{}
			for _, k := range dataInts(t, p.Messages) {
				seen[k] = true
			}
			if len(seen) != 6 {
				t.Errorf("group %q: got %v, want each of 0..5 once", g, dataInts(t, p.Messages))
			}
			if g != "" && (p.ConsumerGroup != g || p.Messages[0].ConsumerGroup != g) {
				t.Errorf("group %q: reply names group %q / %q", g, p.ConsumerGroup, p.Messages[0].ConsumerGroup)
			}
			s.ackAll(t, p, "completed")
			s.mustEmpty(t, q, query)
		}
	})

	t.Run("NewGroupStartsAtEnd", func(t *testing.T) {
		t.Parallel()
		q := "pop-new-group"
		s.pushN(t, q, "p", 3)
		// Default mode for a new named group is "new": it starts at the end.
		s.mustEmpty(t, q, "consumerGroup=late&batch=10")
		s.mustEmpty(t, q, "consumerGroup=late-explicit&subscriptionMode=new&batch=10")
		s.mustEmpty(t, q, "consumerGroup=late-only&subscriptionMode=new-only&batch=10")
		all := s.mustPop(t, q, "consumerGroup=everything&subscriptionMode=all&batch=10", 3)
		s.ackAll(t, all, "completed")
		s.push(t, []pushItem{{Queue: q, Partition: "p", Payload: M{"i": 3}}, {Queue: q, Partition: "p", Payload: M{"i": 4}}})
		for _, g := range []string{"late", "late-explicit", "late-only"} {
			p := s.mustPop(t, q, "consumerGroup="+g+"&batch=10", 2)
			if !intsEqual(dataInts(t, p.Messages), []int{3, 4}) {
				t.Errorf("group %s: got %v, want only the messages pushed after its first pop (3,4)", g, dataInts(t, p.Messages))
			}
		}
		p := s.mustPop(t, q, "consumerGroup=everything&batch=10", 2)
		if !intsEqual(dataInts(t, p.Messages), []int{3, 4}) {
			t.Errorf("group everything: got %v, want 3,4", dataInts(t, p.Messages))
		}
		// A queue-mode consumer sees everything.
		s.mustPop(t, q, "batch=10", 5)
	})

	// The group's first pop fixes its start even when the queue does not
	// exist yet: what is pushed after that pop is delivered. (docs/http-api.md: "new: at
	// the end of the queue as it is when the group is created"; a Queen
	// consumer that starts before its producer must not lose the first
	// messages.)
	t.Run("FromBeginningIsAll", func(t *testing.T) {
		t.Parallel()
		// Queen's JavaScript client spells "all" from_beginning, with and
		// without a consumer group.
		q := "pop-from-beginning"
		s.pushN(t, q, "p", 3)
		g := s.mustPop(t, q, "consumerGroup=fb&subscriptionMode=from_beginning&batch=10", 3)
		if !intsEqual(dataInts(t, g.Messages), []int{0, 1, 2}) {
			t.Errorf("group with from_beginning: got %v, want 0,1,2 (the backlog)", dataInts(t, g.Messages))
		}
		qm := s.mustPop(t, q, "subscriptionMode=from_beginning&batch=10", 3)
		if !intsEqual(dataInts(t, qm.Messages), []int{0, 1, 2}) {
			t.Errorf("queue mode with from_beginning: got %v, want 0,1,2", dataInts(t, qm.Messages))
		}
		s.expectError(t, "GET", "/api/v1/pop/queue/"+q+"?consumerGroup=fb2&subscriptionMode=beginning", nil, 400, "invalid_parameter", "subscriptionMode")
	})

	t.Run("NewGroupBeforeQueueExists", func(t *testing.T) {
		t.Parallel()
		q := "pop-new-group-no-queue"
		s.mustEmpty(t, q, "consumerGroup=early&batch=10")
		s.pushN(t, q, "p", 2)
		p := s.pop(t, q, "consumerGroup=early&batch=10")
		if p == nil || len(p.Messages) != 2 {
			t.Fatalf("GET %s after a first pop before the queue existed and a push of 2: got %+v, want the 2 messages",
				popPath(q, "consumerGroup=early&batch=10"), p)
		}
	})

	t.Run("SubscriptionFrom", func(t *testing.T) {
		t.Parallel()
		q := "pop-sub-from"
		for i := 0; i < 3; i++ { // separate requests: distinct createdAt
			s.push(t, []pushItem{{Queue: q, Partition: "p", Payload: M{"i": i}}})
			time.Sleep(2 * time.Millisecond)
		}
		time.Sleep(30 * time.Millisecond)
		from := time.Now().UTC()
		time.Sleep(30 * time.Millisecond)
		s.push(t, []pushItem{{Queue: q, Partition: "p", Payload: M{"i": 3}}, {Queue: q, Partition: "p", Payload: M{"i": 4}}})
		p := s.mustPop(t, q, "consumerGroup=from-time&batch=10&subscriptionFrom="+url.QueryEscape(from.Format(time.RFC3339Nano)), 2)
		if !intsEqual(dataInts(t, p.Messages), []int{3, 4}) {
			t.Errorf("subscriptionFrom=%s: got %v, want 3,4", from.Format(time.RFC3339Nano), dataInts(t, p.Messages))
		}
		// The exact createdAt of a message includes it ("at or after").
		first := s.mustPop(t, q, "consumerGroup=from-all&subscriptionMode=all&batch=10", 5)
		at := first.Messages[1].CreatedAt
		p2 := s.mustPop(t, q, "consumerGroup=from-exact&batch=10&subscriptionFrom="+url.QueryEscape(at), 4)
		if !intsEqual(dataInts(t, p2.Messages), []int{1, 2, 3, 4}) {
			t.Errorf("subscriptionFrom=%s (createdAt of message 1): got %v, want 1..4", at, dataInts(t, p2.Messages))
		}
		// "now": only later messages.
		s.mustEmpty(t, q, "consumerGroup=from-now&subscriptionFrom=now")
		s.push(t, []pushItem{{Queue: q, Partition: "p", Payload: M{"i": 5}}})
		p3 := s.mustPop(t, q, "consumerGroup=from-now&batch=10", 1)
		if dataInts(t, p3.Messages)[0] != 5 {
			t.Errorf("subscriptionFrom=now: got %v, want 5", dataInts(t, p3.Messages))
		}
	})

	t.Run("AutoAck", func(t *testing.T) {
		t.Parallel()
		q := "pop-autoack"
		s.pushN(t, q, "p", 3)
		p := s.mustPop(t, q, "batch=10&autoAck=true", 3)
		if p.LeaseID != "" {
			t.Errorf("autoAck: reply leaseId %q, want \"\"", p.LeaseID)
		}
		for _, m := range p.Messages {
			if m.LeaseID != "" {
				t.Errorf("autoAck: message leaseId %q, want \"\"", m.LeaseID)
			}
		}
		s.mustEmpty(t, q, "batch=10")
		qi, _ := s.queueInfo(t, q)
		if qi.Messages.Pending != 0 {
			t.Errorf("autoAck: %d messages still pending", qi.Messages.Pending)
		}
		// Another group still sees them.
		s.mustPop(t, q, "batch=10&consumerGroup=other&subscriptionMode=all", 3)
	})

	t.Run("AttemptAndRetryCount", func(t *testing.T) {
		t.Parallel()
		q := "pop-attempt"
		s.pushN(t, q, "p", 1)
		m := s.mustPop(t, q, "", 1).Messages[0]
		if m.Attempt != 1 || m.RetryCount != 0 {
			t.Fatalf("first delivery: attempt %d retryCount %d", m.Attempt, m.RetryCount)
		}
		s.mustAck(t, ackFor(m, "failed"))
		m2 := s.mustPop(t, q, "", 1).Messages[0]
		if m2.ID != m.ID || m2.Attempt != 2 || m2.RetryCount != 1 {
			t.Errorf("after one failed ack: id %s attempt %d retryCount %d; want %s, 2, 1", m2.ID, m2.Attempt, m2.RetryCount, m.ID)
		}
		// "retry" redelivers without counting a failure: retryCount stays.
		// (docs/http-api.md: "delivered again without counting an attempt"; read as: it
		// does not count toward retryLimit, so retryCount is unchanged. attempt
		// still counts deliveries, so it is not asserted here.)
		s.mustAck(t, ackFor(m2, "retry"))
		m3 := s.mustPop(t, q, "", 1).Messages[0]
		if m3.ID != m.ID || m3.RetryCount != 1 {
			t.Errorf("after a retry ack: id %s retryCount %d; want %s, 1", m3.ID, m3.RetryCount, m.ID)
		}
		s.mustAck(t, ackFor(m3, "failed"))
		m4 := s.mustPop(t, q, "", 1).Messages[0]
		if m4.RetryCount != 2 || m4.Attempt <= m2.Attempt {
			t.Errorf("after a second failed ack: attempt %d retryCount %d; want > %d and 2", m4.Attempt, m4.RetryCount, m2.Attempt)
		}
		// Attempts are per group: a new group sees attempt 1.
		g := s.mustPop(t, q, "consumerGroup=fresh&subscriptionMode=all", 1).Messages[0]
		if g.Attempt != 1 || g.RetryCount != 0 {
			t.Errorf("other group: attempt %d retryCount %d, want 1 and 0", g.Attempt, g.RetryCount)
		}
	})
}

func distinctPartitions(ms []message) int {
	set := map[string]bool{}
	for _, m := range ms {
		set[m.PartitionID] = true
	}
	return len(set)
}

// TestDefaultSubscriptionModeAll: with QUEEN_DEFAULT_SUBSCRIPTION_MODE=all a
// new named group that names no mode starts at the oldest message; a pop that
// names "new" still starts at the end.
func TestDefaultSubscriptionModeAll(t *testing.T) {
	t.Parallel()
	s := startServer(t, withEnv("QUEEN_DEFAULT_SUBSCRIPTION_MODE", "all"))
	q := "default-mode-all"
	s.pushN(t, q, "p", 3)
	p := s.mustPop(t, q, "consumerGroup=g&batch=10", 3)
	if !intsEqual(dataInts(t, p.Messages), []int{0, 1, 2}) {
		t.Errorf("default mode all: got %v", dataInts(t, p.Messages))
	}
	s.mustEmpty(t, q, "consumerGroup=h&subscriptionMode=new&batch=10")
	s.pushN(t, q, "p", 1)
	if p := s.mustPop(t, q, "consumerGroup=h&batch=10", 1); dataInts(t, p.Messages)[0] != 0 {
		t.Errorf("group h: got %s, want the message pushed after its first pop", p.Messages[0].Data)
	}
}

// TestDelayedProcessingAndWindowBuffer: delayedProcessing hides a message
// until it is that old; windowBuffer holds a whole partition back until its
// newest message is that old.
func TestDelayedProcessingAndWindowBuffer(t *testing.T) {
	t.Parallel()
	s := startServer(t)

	t.Run("DelayedProcessing", func(t *testing.T) {
		t.Parallel()
		q := "delayed"
		s.configure(t, M{"queue": q, "options": M{"delayedProcessing": 2}})
		sent := time.Now()
		s.pushN(t, q, "p", 1)
		s.mustEmpty(t, q, "")
		time.Sleep(1 * time.Second)
		s.mustEmpty(t, q, "")
		var p *popReply
		if err := checkFor(8*time.Second, 50*time.Millisecond, func() error {
			if p = s.pop(t, q, ""); p == nil {
				return fmt.Errorf("not delivered %v after the push", time.Since(sent))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if el := time.Since(sent); el < 1950*time.Millisecond {
			t.Errorf("delayedProcessing 2 s: delivered after %v", el)
		}
	})

	t.Run("DelayedProcessingLongPoll", func(t *testing.T) {
		t.Parallel()
		q := "delayed-wait"
		s.configure(t, M{"queue": q, "options": M{"delayedProcessing": 1}})
		sent := time.Now()
		s.pushN(t, q, "p", 1)
		p := s.pop(t, q, "wait=true&timeout=5000")
		if p == nil {
			t.Fatalf("a long poll (timeout 5 s) on a message delayed 1 s returned 204 after %v", time.Since(sent))
		}
		if el := time.Since(sent); el < 950*time.Millisecond {
			t.Errorf("delayedProcessing 1 s: delivered after %v", el)
		}
	})

	t.Run("WindowBuffer", func(t *testing.T) {
		t.Parallel()
		q := "window"
		s.configure(t, M{"queue": q, "options": M{"windowBuffer": 2}})
		s.pushN(t, q, "p", 1)
		s.mustEmpty(t, q, "batch=10")
		time.Sleep(1 * time.Second)
		last := time.Now()
		s.push(t, []pushItem{{Queue: q, Partition: "p", Payload: M{"i": 1}}})
		time.Sleep(1300 * time.Millisecond) // the first message is now > 2 s old, the newest is not
		s.mustEmpty(t, q, "batch=10")
		var p *popReply
		if err := checkFor(8*time.Second, 50*time.Millisecond, func() error {
			if p = s.pop(t, q, "batch=10"); p == nil {
				return fmt.Errorf("partition not released %v after its newest message", time.Since(last))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if el := time.Since(last); el < 1950*time.Millisecond {
			t.Errorf("windowBuffer 2 s: partition released %v after its newest message", el)
		}
		if !intsEqual(dataInts(t, p.Messages), []int{0, 1}) {
			t.Errorf("windowBuffer: got %v, want the whole partition 0,1", dataInts(t, p.Messages))
		}
	})
}
