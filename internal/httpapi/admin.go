package httpapi

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/queen-mq/queen/internal/broker"
)

type configureBody struct {
	Queue     *string                    `json:"queue"`
	Namespace *string                    `json:"namespace"`
	Task      *string                    `json:"task"`
	Options   map[string]json.RawMessage `json:"options"`
}

func optionsJSON(o broker.QueueOptions) map[string]any {
	m := map[string]any{
		"leaseTime": o.LeaseTime, "retryLimit": o.RetryLimit, "retryDelay": o.RetryDelay,
		"delayedProcessing": o.DelayedProcessing, "windowBuffer": o.WindowBuffer, "maxSize": o.MaxSize,
		"retentionSeconds": o.RetentionSeconds, "retentionMessages": o.RetentionMessages,
		"completedRetentionSeconds": o.CompletedRetentionSeconds, "maxWaitTimeSeconds": o.MaxWaitTimeSeconds,
		"encryptionEnabled": o.EncryptionEnabled,
	}
	for k, v := range o.Extra {
		m[k] = v
	}
	return m
}

func (s *Server) handleConfigure(w http.ResponseWriter, r *http.Request) {
	var body configureBody
	if !s.decode(w, r, &body) {
		return
	}
	if body.Queue == nil {
		writeError(w, &broker.Error{Code: "invalid_parameter", Field: "queue", Message: "queue is required"})
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	out, err := s.b.Configure(ctx, broker.ConfigureRequest{Tenant: s.tenant(r), Queue: *body.Queue, Namespace: body.Namespace, Task: body.Task, Options: body.Options})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	reply := map[string]any{"configured": true, "queue": *body.Queue, "options": optionsJSON(out.Options)}
	if out.Namespace != "" {
		reply["namespace"] = out.Namespace
	}
	if out.Task != "" {
		reply["task"] = out.Task
	}
	writeJSON(w, http.StatusOK, reply)
}

func queueJSON(q *broker.QueueInfo) map[string]any {
	m := map[string]any{
		"name": q.Name, "partitions": q.Partitions,
		"messages":  map[string]any{"total": q.Total, "pending": q.Pending},
		"createdAt": formatMicros(q.CreatedAt),
		"options":   optionsJSON(q.Options),
	}
	if q.Namespace != "" {
		m["namespace"] = q.Namespace
	}
	if q.Task != "" {
		m["task"] = q.Task
	}
	return m
}

func (s *Server) handleQueues(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := requestContext(r)
	defer cancel()
	qs, err := s.b.Queues(ctx, s.tenant(r))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]map[string]any, 0, len(qs))
	for i := range qs {
		out = append(out, queueJSON(&qs[i]))
	}
	writeJSON(w, http.StatusOK, map[string]any{"queues": out})
}

func partitionsJSON(parts []broker.PartitionInfo) []map[string]any {
	out := make([]map[string]any, 0, len(parts))
	for _, p := range parts {
		groups := make([]map[string]any, 0, len(p.Groups))
		for _, g := range p.Groups {
			gm := map[string]any{"consumerGroup": g.Group, "offset": g.Cursor, "lag": g.Lag, "lagSeconds": g.LagSeconds, "leased": g.Leased}
			if g.Leased {
				gm["leaseId"] = g.LeaseID
				gm["leaseExpiresAt"] = formatMicros(g.LeaseExpires)
			}
			groups = append(groups, gm)
		}
		out = append(out, map[string]any{
			"id": strconv.FormatUint(p.ID, 10), "name": p.Name, "firstOffset": p.First, "nextOffset": p.Next,
			"messages": p.Next - p.First, "createdAt": formatMicros(p.CreatedAt), "lastMessageAt": formatMicros(p.LastTime),
			"consumerGroups": groups,
		})
	}
	return out
}

func pageParams(w http.ResponseWriter, r *http.Request) (after uint64, limit int, ok bool) {
	l, e := qInt(r, "limit", 100, 1, 10000)
	if e != nil {
		writeError(w, e)
		return 0, 0, false
	}
	if a := qStr(r, "after"); a != "" {
		v, err := strconv.ParseUint(a, 10, 64)
		if err != nil {
			writeError(w, &broker.Error{Code: "invalid_parameter", Field: "after", Message: "after must be a partition id (the last id of the previous page)"})
			return 0, 0, false
		}
		after = v
	}
	return after, int(l), true
}

func (s *Server) handleQueue(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("queue")
	if e := broker.ValidName("queue", name); e != nil {
		writeError(w, e)
		return
	}
	after, limit, ok := pageParams(w, r)
	if !ok {
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	q, parts, err := s.b.QueueDetail(ctx, s.tenant(r), name, after, limit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if q == nil {
		writeError(w, &broker.Error{Code: "queue_not_found", Message: "queue " + strconv.Quote(name) + " does not exist; push to it or POST /api/v1/configure to create it"})
		return
	}
	m := queueJSON(q)
	m["partitionDetails"] = partitionsJSON(parts)
	if len(parts) == limit {
		m["nextAfter"] = strconv.FormatUint(parts[len(parts)-1].ID, 10)
	}
	writeJSON(w, http.StatusOK, m)
}

func (s *Server) handleDeleteQueue(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := requestContext(r)
	defer cancel()
	name := r.PathValue("queue")
	found, err := s.b.DeleteQueue(ctx, s.tenant(r), name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !found {
		writeError(w, &broker.Error{Code: "queue_not_found", Message: "queue " + strconv.Quote(name) + " does not exist"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"deleted": true, "queue": name})
}

func groupsJSON(gs []broker.GroupQueue) []map[string]any {
	byGroup := map[string]map[string]any{}
	var order []string
	for _, g := range gs {
		name := g.Group
		m, ok := byGroup[name]
		if !ok {
			m = map[string]any{"name": name, "queues": []map[string]any{}, "pending": int64(0), "consumed": int64(0), "dlq": int64(0)}
			byGroup[name] = m
			order = append(order, name)
		}
		m["queues"] = append(m["queues"].([]map[string]any), map[string]any{
			"queue": g.Queue, "pending": g.Pending, "lag": g.Pending, "consumed": g.Consumed, "dlq": g.DLQ,
			"skipped": g.Skipped, "subscribedAt": formatMicros(g.CreatedAt), "start": g.Rule,
		})
		m["pending"] = m["pending"].(int64) + g.Pending
		m["consumed"] = m["consumed"].(int64) + g.Consumed
		m["dlq"] = m["dlq"].(int64) + g.DLQ
	}
	out := make([]map[string]any, 0, len(order))
	for _, n := range order {
		out = append(out, byGroup[n])
	}
	return out
}

func (s *Server) handleGroups(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := requestContext(r)
	defer cancel()
	gs, err := s.b.Groups(ctx, s.tenant(r), "")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"consumerGroups": groupsJSON(gs)})
}

func (s *Server) handleGroup(w http.ResponseWriter, r *http.Request) {
	group := r.PathValue("group")
	after, limit, ok := pageParams(w, r)
	if !ok {
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	gs, err := s.b.Groups(ctx, s.tenant(r), group)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if len(gs) == 0 {
		writeError(w, &broker.Error{Code: "group_not_found", Message: "consumer group " + strconv.Quote(group) + " reads no queue"})
		return
	}
	m := groupsJSON(gs)[0]
	for _, qm := range m["queues"].([]map[string]any) {
		parts, err := s.b.GroupPartitions(ctx, s.tenant(r), group, qm["queue"].(string), after, limit)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		qm["partitions"] = partitionsJSON(parts)
	}
	writeJSON(w, http.StatusOK, m)
}

func (s *Server) handleSeek(w http.ResponseWriter, r *http.Request) {
	var body struct {
		ToEnd     *bool   `json:"toEnd"`
		ToStart   *bool   `json:"toStart"`
		Timestamp *string `json:"timestamp"`
	}
	if !s.decode(w, r, &body) {
		return
	}
	req := broker.SeekRequest{Tenant: s.tenant(r), Group: r.PathValue("group"), Queue: r.PathValue("queue")}
	req.ToEnd = body.ToEnd != nil && *body.ToEnd
	req.ToStart = body.ToStart != nil && *body.ToStart
	if body.Timestamp != nil {
		t, err := time.Parse(time.RFC3339Nano, *body.Timestamp)
		if err != nil {
			writeError(w, &broker.Error{Code: "invalid_parameter", Field: "timestamp", Message: "timestamp must be an RFC 3339 time"})
			return
		}
		req.Time = t
	}
	s.seek(w, r, req)
}

func (s *Server) seek(w http.ResponseWriter, r *http.Request, req broker.SeekRequest) {
	ctx, cancel := requestContext(r)
	defer cancel()
	n, err := s.b.Seek(ctx, req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if n == 0 {
		writeError(w, &broker.Error{Code: "group_not_found", Message: "consumer group " + strconv.Quote(req.Group) + " does not read that queue yet; pop once to create it"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": true, "consumerGroup": req.Group, "queues": n})
}

func (s *Server) handleSubscription(w http.ResponseWriter, r *http.Request) {
	var body struct {
		SubscriptionTimestamp *string `json:"subscriptionTimestamp"`
	}
	if !s.decode(w, r, &body) {
		return
	}
	if body.SubscriptionTimestamp == nil {
		writeError(w, &broker.Error{Code: "invalid_parameter", Field: "subscriptionTimestamp", Message: "subscriptionTimestamp is required (RFC 3339)"})
		return
	}
	t, err := time.Parse(time.RFC3339Nano, *body.SubscriptionTimestamp)
	if err != nil {
		writeError(w, &broker.Error{Code: "invalid_parameter", Field: "subscriptionTimestamp", Message: "subscriptionTimestamp must be an RFC 3339 time"})
		return
	}
	s.seek(w, r, broker.SeekRequest{Tenant: s.tenant(r), Group: r.PathValue("group"), Time: t})
}

func (s *Server) handleDeleteGroup(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := requestContext(r)
	defer cancel()
	group := r.PathValue("group")
	n, err := s.b.DeleteGroup(ctx, s.tenant(r), group, r.PathValue("queue"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if n == 0 {
		writeError(w, &broker.Error{Code: "group_not_found", Message: "consumer group " + strconv.Quote(group) + " not found"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"deleted": true, "consumerGroup": group, "queues": n})
}
