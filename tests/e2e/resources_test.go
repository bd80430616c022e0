package e2e

import (
	"encoding/json"
	"fmt"
	"net/url"
	"testing"
	"time"
)

// partitionDetail is one entry of a queue detail's partitionDetails.
//
// docs/http-api.md names no fields for the per-partition detail ("offsets, per-group
// lag"); these are the names the server reports, checked for their values.
type partitionDetail struct {
	ID             string `json:"id"`
	Name           string `json:"name"`
	FirstOffset    *int64 `json:"firstOffset"`
	NextOffset     *int64 `json:"nextOffset"`
	ConsumerGroups []struct {
		ConsumerGroup string `json:"consumerGroup"`
		Offset        int64  `json:"offset"`
		Lag           *int64 `json:"lag"`
		Leased        bool   `json:"leased"`
	} `json:"consumerGroups"`
}

type queueDetail struct {
	queueSummary
	PartitionDetails []partitionDetail `json:"partitionDetails"`
}

func (s *server) queueDetail(t testing.TB, queue, query string) queueDetail {
	t.Helper()
	var d queueDetail
	path := "/api/v1/resources/queues/" + url.PathEscape(queue)
	if query != "" {
		path += "?" + query
	}
	r := s.callJSON(t, "GET", path, nil, 200, &d)
	if d.PartitionDetails == nil {
		t.Fatalf("queue detail without partitionDetails:\n%s", r)
	}
	return d
}

func TestResources(t *testing.T) {
	t.Parallel()
	s := startServer(t)

	t.Run("ListExactTotals", func(t *testing.T) {
		t.Parallel()
		s.push(t, []pushItem{{Queue: "res-a", Partition: "x", Payload: 1}, {Queue: "res-a", Partition: "y", Payload: 2}, {Queue: "res-a", Partition: "x", Payload: 3}})
		s.pushN(t, "res-b", "p", 5)
		qs := s.queues(t)
		a, b := qs["res-a"], qs["res-b"]
		if a.Partitions != 2 || a.Messages.Total != 3 || a.Messages.Pending != 3 {
			t.Errorf("res-a: %+v, want 2 partitions, total 3, pending 3", a)
		}
		if b.Partitions != 1 || b.Messages.Total != 5 || b.Messages.Pending != 5 {
			t.Errorf("res-b: %+v, want 1 partition, total 5, pending 5", b)
		}
		parseAPITime(t, "createdAt", a.CreatedAt)
		// Consume 2 of res-b in queue mode: pending drops, total (retained) stays.
		s.ackAll(t, s.mustPop(t, "res-b", "batch=2", 2), "completed")
		if b := s.queues(t)["res-b"]; b.Messages.Total != 5 || b.Messages.Pending != 3 {
			t.Errorf("res-b after consuming 2: %+v, want total 5, pending 3", b.Messages)
		}
		// Leased but unacknowledged messages are still pending.
		s.mustPop(t, "res-b", "batch=1", 1)
		if b := s.queues(t)["res-b"]; b.Messages.Pending != 3 {
			t.Errorf("res-b with one leased: pending %d, want 3", b.Messages.Pending)
		}
	})

	t.Run("DetailPagedWithLag", func(t *testing.T) {
		t.Parallel()
		q := "res-paged"
		var items []pushItem
		for i := 0; i < 25; i++ {
			items = append(items, pushItem{Queue: q, Partition: fmt.Sprintf("p%02d", i), Payload: M{"i": i}})
		}
		items = append(items, pushItem{Queue: q, Partition: "p00", Payload: M{"i": 25}}, pushItem{Queue: q, Partition: "p00", Payload: M{"i": 26}})
		pushed := s.push(t, items)
		// Group g consumes one message of p00 (3 messages there).
		p := s.popPartition(t, q, "p00", "consumerGroup=g&subscriptionMode=all")
		if p == nil {
			t.Fatalf("pop of p00 gave 204")
		}
		s.ackAll(t, p, "completed")

		seen := map[string]partitionDetail{}
		after := ""
		pages := 0
		for {
			query := "limit=10"
			if after != "" {
				query += "&after=" + url.QueryEscape(after)
			}
			d := s.queueDetail(t, q, query)
			if d.Messages.Total != 27 || d.Partitions != 25 {
				t.Errorf("detail page %d: total %d partitions %d, want 27 and 25", pages, d.Messages.Total, d.Partitions)
			}
			if len(d.PartitionDetails) > 10 {
				t.Fatalf("limit=10 gave %d partitions", len(d.PartitionDetails))
			}
			pages++
			for _, pd := range d.PartitionDetails {
				if _, dup := seen[pd.ID]; dup {
					t.Errorf("partition %s (%s) on two pages", pd.ID, pd.Name)
				}
				seen[pd.ID] = pd
			}
			if len(d.PartitionDetails) < 10 || pages > 5 {
				break
			}
			after = d.PartitionDetails[len(d.PartitionDetails)-1].ID
		}
		if len(seen) != 25 || pages != 3 {
			t.Fatalf("paging by 10 gave %d partitions in %d pages, want 25 in 3", len(seen), pages)
		}
		p00 := seen[pushed[0].PartitionID]
		if p00.Name != "p00" {
			t.Fatalf("partition %s: name %q, want p00", pushed[0].PartitionID, p00.Name)
		}
		if p00.FirstOffset == nil || p00.NextOffset == nil || *p00.NextOffset-*p00.FirstOffset != 3 {
			t.Errorf("p00 offsets first %v next %v, want 3 messages", p00.FirstOffset, p00.NextOffset)
		}
		var lag *int64
		for _, g := range p00.ConsumerGroups {
			if g.ConsumerGroup == "g" {
				lag = g.Lag
			}
		}
		if lag == nil || *lag != 2 {
			t.Errorf("p00: lag of group g %v, want 2 (3 messages, 1 consumed); groups %+v", lag, p00.ConsumerGroups)
		}
	})

	t.Run("DeleteQueue", func(t *testing.T) {
		t.Parallel()
		q := "res-del"
		old := s.push(t, []pushItem{{Queue: q, Partition: "a", Payload: 1}, {Queue: q, Partition: "b", Payload: 2}})
		p := s.mustPop(t, q, "batch=10", 1)
		s.callJSON(t, "DELETE", "/api/v1/resources/queues/"+q, nil, 200, nil)
		s.expectError(t, "GET", "/api/v1/resources/queues/"+q, nil, 404, "", "")
		if _, ok := s.queues(t)[q]; ok {
			t.Errorf("deleted queue still listed")
		}
		s.expectError(t, "DELETE", "/api/v1/resources/queues/"+q, nil, 404, "", "")
		// A pop creates the queue again (empty), as a push would.
		s.mustEmpty(t, q, "batch=10")
		if r := s.ack(t, ackFor(p.Messages[0], "completed")); r.Success {
			t.Errorf("ack of a message of a deleted queue succeeded")
		}
		// Re-created by push, with new partition ids.
		fresh := s.push(t, []pushItem{{Queue: q, Partition: "a", Payload: 3}, {Queue: q, Partition: "b", Payload: 4}})
		for i := range fresh {
			for _, o := range old {
				if fresh[i].PartitionID == o.PartitionID || fresh[i].MessageID == o.MessageID {
					t.Errorf("re-created queue reuses partition id %s / message id %s", o.PartitionID, o.MessageID)
				}
			}
		}
		if n := s.queueTotal(t, q); n != 2 {
			t.Errorf("re-created queue total %d, want 2", n)
		}
		pp := s.mustPop(t, q, "batch=10&partitions=10", 2)
		if got := dataTexts(t, pp.Messages); !(got[0] == "3" && got[1] == "4" || got[0] == "4" && got[1] == "3") {
			t.Errorf("re-created queue holds %v, want 3 and 4", got)
		}
	})
}

type groupQueue struct {
	Queue      string            `json:"queue"`
	Pending    *int64            `json:"pending"`
	Lag        *int64            `json:"lag"`
	Partitions []json.RawMessage `json:"partitions"`
}

type groupInfo struct {
	Name   string       `json:"name"`
	Queues []groupQueue `json:"queues"`
}

func (s *server) groups(t testing.TB) map[string]groupInfo {
	t.Helper()
	var out struct {
		ConsumerGroups []groupInfo `json:"consumerGroups"`
	}
	r := s.callJSON(t, "GET", "/api/v1/consumer-groups", nil, 200, &out)
	if out.ConsumerGroups == nil {
		t.Fatalf("consumer-groups list without consumerGroups:\n%s", r)
	}
	m := map[string]groupInfo{}
	for _, g := range out.ConsumerGroups {
		m[g.Name] = g
	}
	return m
}

func (g groupInfo) queue(name string) *groupQueue {
	for i := range g.Queues {
		if g.Queues[i].Queue == name {
			return &g.Queues[i]
		}
	}
	return nil
}

func TestConsumerGroups(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	const q, q2 = "cg-q", "cg-q2"
	// Separate pushes so createdAt differs between messages.
	for i := 0; i < 5; i++ {
		s.push(t, []pushItem{{Queue: q, Partition: "p", Payload: M{"i": i}}})
		time.Sleep(3 * time.Millisecond)
	}
	s.pushN(t, q2, "p", 2)
	all := s.mustPop(t, q, "consumerGroup=reader&subscriptionMode=all&batch=100", 5)
	created := make([]string, 5)
	for i, m := range all.Messages {
		created[i] = m.CreatedAt
	}
	s.ackBatch(t, "", []ackReq{ackFor(all.Messages[0], "completed"), ackFor(all.Messages[1], "completed"),
		ackFor(all.Messages[2], "retry"), ackFor(all.Messages[3], "retry"), ackFor(all.Messages[4], "retry")})
	// reader has consumed 2 of 5 on q; it also reads q2 (consumed nothing).
	s.mustPop(t, q2, "consumerGroup=reader&subscriptionMode=all&autoAck=false&batch=1", 1)

	t.Run("ListAndDetail", func(t *testing.T) {
		g, ok := s.groups(t)["reader"]
		if !ok {
			t.Fatalf("group reader not listed")
		}
		gq := g.queue(q)
		if gq == nil || g.queue(q2) == nil {
			t.Fatalf("group reader lists queues %+v, want %s and %s", g.Queues, q, q2)
		}
		if gq.Lag == nil || *gq.Lag != 3 {
			t.Errorf("reader lag on %s: %v, want 3", q, gq.Lag)
		}
		var d groupInfo
		s.callJSON(t, "GET", "/api/v1/consumer-groups/reader", nil, 200, &d)
		dq := d.queue(q)
		if d.Name != "reader" || dq == nil || dq.Lag == nil || *dq.Lag != 3 {
			t.Errorf("group detail: %+v", d)
		}
		if dq != nil && len(dq.Partitions) != 1 {
			t.Errorf("group detail of %s: %d partitions, want 1", q, len(dq.Partitions))
		}
		s.expectError(t, "GET", "/api/v1/consumer-groups/nobody", nil, 404, "", "")
	})

	seek := func(t *testing.T, body M) {
		t.Helper()
		s.callJSON(t, "POST", "/api/v1/consumer-groups/reader/queues/"+q+"/seek", body, 200, nil)
	}
	popData := func(t *testing.T) []int {
		t.Helper()
		p := s.pop(t, q, "consumerGroup=reader&batch=100")
		if p == nil {
			return nil
		}
		s.ackAll(t, p, "completed")
		return dataInts(t, p.Messages)
	}

	t.Run("SeekToEnd", func(t *testing.T) {
		seek(t, M{"toEnd": true})
		if got := popData(t); got != nil {
			t.Errorf("after seek toEnd: got %v, want nothing", got)
		}
		s.push(t, []pushItem{{Queue: q, Partition: "p", Payload: M{"i": 5}}})
		if got := popData(t); !intsEqual(got, []int{5}) {
			t.Errorf("after seek toEnd and a push: got %v, want [5]", got)
		}
	})

	t.Run("SeekToStart", func(t *testing.T) {
		seek(t, M{"toStart": true})
		if got := popData(t); !intsEqual(got, seq(0, 6)) {
			t.Errorf("after seek toStart: got %v, want 0..5", got)
		}
	})

	t.Run("SeekTimestamp", func(t *testing.T) {
		seek(t, M{"timestamp": created[3]})
		if got := popData(t); !intsEqual(got, []int{3, 4, 5}) {
			t.Errorf("after seek to createdAt of message 3 (%s): got %v, want 3,4,5", created[3], got)
		}
	})

	t.Run("Subscription", func(t *testing.T) {
		s.callJSON(t, "POST", "/api/v1/consumer-groups/reader/subscription", M{"subscriptionTimestamp": created[4]}, 200, nil)
		if got := popData(t); !intsEqual(got, []int{4, 5}) {
			t.Errorf("after subscription at createdAt of message 4 (%s): got %v, want 4,5", created[4], got)
		}
	})

	t.Run("SeekDoesNotTouchOtherGroups", func(t *testing.T) {
		p := s.mustPop(t, q, "consumerGroup=bystander&subscriptionMode=all&batch=100", 6)
		s.ackAll(t, p, "completed")
		seek(t, M{"toStart": true})
		s.mustEmpty(t, q, "consumerGroup=bystander&batch=100")
		popData(t)
	})

	t.Run("DeleteOneQueue", func(t *testing.T) {
		s.callJSON(t, "DELETE", "/api/v1/consumer-groups/reader/queues/"+q, nil, 200, nil)
		var d groupInfo
		r := s.call(t, "GET", "/api/v1/consumer-groups/reader", nil)
		if r.Status != 200 {
			t.Fatalf("group reader still reads %s, yet:\n%s", q2, r)
		}
		json.Unmarshal(r.Body, &d)
		if d.queue(q) != nil || d.queue(q2) == nil {
			t.Errorf("after deleting reader's subscription to %s: queues %+v", q, d.Queues)
		}
		// Messages of the queue are untouched.
		if n := s.queueTotal(t, q); n != 6 {
			t.Errorf("queue total %d, want 6", n)
		}
	})

	t.Run("DeleteGroup", func(t *testing.T) {
		s.callJSON(t, "DELETE", "/api/v1/consumer-groups/reader", nil, 200, nil)
		s.expectError(t, "GET", "/api/v1/consumer-groups/reader", nil, 404, "", "")
		if _, ok := s.groups(t)["reader"]; ok {
			t.Errorf("deleted group still listed")
		}
		if _, ok := s.groups(t)["bystander"]; !ok {
			t.Errorf("deleting reader removed bystander")
		}
		// Popping again creates a new group (default mode new: at the end).
		s.mustEmpty(t, q, "consumerGroup=reader&batch=100")
	})
}
