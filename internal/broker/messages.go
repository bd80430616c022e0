package broker

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/stagetime"
	"github.com/queen-mq/queen/internal/state"
)

// DefaultPartition is the partition of a message that names none.
const DefaultPartition = "Default"

// PushItem is one message to push. Payload is raw JSON, stored as given.
type PushItem struct {
	Queue     string
	Partition string // "" is not a default: callers pass DefaultPartition
	Payload   []byte
	TxID      string // "" = generated
	TraceID   string
	// Fresh: the producer vouches that TxID was never pushed before (its
	// ids are unique by construction, as the PostgreSQL source's are, and
	// its own bookkeeping keeps it from pushing one twice). The push then
	// skips looking TxID up among the partition's stored messages, a read
	// per message when the ids do not ascend; TxID is still recorded, and
	// a retried proposal still looks it up. Not settable over HTTP.
	Fresh bool
}

// PushOutcome reports one pushed item.
type PushOutcome struct {
	Index       int
	Duplicate   bool
	TxID        string
	MessageID   string
	PartitionID uint64
	Offset      uint64
	Queue       string
}

// Push stores the items atomically: all of them, or none.
// An empty push stores nothing and answers no outcomes, as Queen does.
func (b *Broker) Push(ctx context.Context, tenant string, items []PushItem) ([]PushOutcome, error) {
	if len(items) == 0 {
		return []PushOutcome{}, nil
	}
	cmd, size, err := b.pushCommand(tenant, items)
	if err != nil {
		return nil, err
	}
	stagetime.From(ctx).Mark(stagetime.Validated)
	// Consumers long-polling these queues on this node are woken as soon
	// as the push is queued for the log, not only once it is applied: the
	// pop each proposes then follows the push in the log (often in the
	// same entry, sharing its fsync), so it sees the new messages one
	// fsync earlier. A pop that still finds nothing waits for the wake
	// that follows the push's apply.
	ctx = cluster.OnQueued(ctx, func() { b.waiters.wakeQueued(pushWakes(cmd)) })
	for attempt := 0; ; attempt++ {
		v, err := b.submit(ctx, cmd, size)
		if err != nil {
			return nil, err
		}
		r, ok := v.(*state.PushResult)
		if !ok {
			return nil, fmt.Errorf("push: unexpected result %T", v)
		}
		if r.Err != nil && r.Err.Code == "encryption_required" && attempt < 3 {
			// The queue became encrypted after this node looked: seal and
			// propose again (the same transaction ids).
			if err := b.sealItems(cmd.Tenant, cmd.Items, true); err != nil {
				return nil, err
			}
			continue
		}
		if r.Err != nil {
			return nil, fromState(r.Err)
		}
		out := pushOutcomes(r)
		b.countPush(cmd.Tenant, out)
		return out, nil
	}
}

// pushWakes lists the queues a push adds messages to.
func pushWakes(cmd *state.Push) []state.Wake {
	var out []state.Wake
	for i := range cmd.Items {
		w := state.Wake{Tenant: cmd.Tenant, Queue: cmd.Items[i].Queue}
		if !slices.Contains(out, w) {
			out = append(out, w)
		}
	}
	return out
}

// sealItems seals the payloads of items bound for encrypted queues (all
// unsealed ones when force is set and the queue is encrypted by then).
func (b *Broker) sealItems(tenant string, items []state.PushItem, force bool) error {
	st := b.node.Store()
	for i := range items {
		it := &items[i]
		if it.Sealed || !st.QueueEncrypted(tenant, it.Queue) {
			continue
		}
		if b.sealer == nil {
			return noKey(it.Queue)
		}
		sealed, err := b.sealer.Seal(it.Payload)
		if err != nil {
			return err
		}
		it.Payload, it.Sealed = sealed, true
	}
	return nil
}

func noKey(queue string) *Error {
	return &Error{Code: "encryption_key_missing", Message: fmt.Sprintf(
		"queue %q is encrypted and this node has no QUEEN_ENCRYPTION_KEY; start it with the cluster's key", queue)}
}

// open decrypts a sealed payload for delivery.
func (b *Broker) open(queue string, payload []byte, sealed bool) ([]byte, error) {
	if !sealed {
		return payload, nil
	}
	if b.sealer == nil {
		return nil, noKey(queue)
	}
	plain, err := b.sealer.Open(payload)
	if err != nil {
		return nil, &Error{Code: "decryption_failed", Message: fmt.Sprintf("queue %q: %v", queue, err)}
	}
	return plain, nil
}

func (b *Broker) pushCommand(tenant string, items []PushItem) (*state.Push, int, error) {
	if len(items) == 0 {
		return nil, 0, invalid("items", "items must hold at least one message")
	}
	if len(items) > MaxPushItems {
		return nil, 0, invalid("items", "a push holds at most %d items, got %d", MaxPushItems, len(items))
	}
	cmd := &state.Push{Tenant: tenant, Items: make([]state.PushItem, len(items))}
	size := 0
	for i := range items {
		it := &items[i]
		// The field name is built only for an error (it costs more than
		// the checks).
		if ValidName("queue", it.Queue) != nil {
			return nil, 0, ValidName(itemField("items", i, "queue"), it.Queue)
		}
		if ValidPartition("partition", it.Partition) != nil {
			return nil, 0, ValidPartition(itemField("items", i, "partition"), it.Partition)
		}
		if len(it.TxID) > MaxTxIDLen {
			return nil, 0, invalid(itemField("items", i, "transactionId"), "transactionId is %d bytes; at most %d are allowed", len(it.TxID), MaxTxIDLen)
		}
		if len(it.Payload) == 0 {
			return nil, 0, invalid(itemField("items", i, "payload"), "payload is required (any JSON value; null counts)")
		}
		si := state.PushItem{Queue: it.Queue, Partition: it.Partition, TxID: it.TxID, TraceID: it.TraceID, Payload: it.Payload}
		if si.TxID == "" {
			si.TxID = newID()
			si.Generated = true
		}
		si.Generated = si.Generated || it.Fresh
		cmd.Items[i] = si
		size += len(it.Payload) + len(si.TxID) + len(it.Queue) + len(it.Partition) + 16
	}
	if err := b.sealItems(tenant, cmd.Items, false); err != nil {
		return nil, 0, err
	}
	return cmd, size, nil
}

func pushOutcomes(r *state.PushResult) []PushOutcome {
	out := make([]PushOutcome, len(r.Items))
	for i, it := range r.Items {
		out[i] = PushOutcome{Index: i, Duplicate: it.Duplicate, TxID: it.TxID, MessageID: state.MessageID(it.PartitionID, it.Offset),
			PartitionID: it.PartitionID, Offset: it.Offset, Queue: it.Queue}
	}
	return out
}

// idLen is the length of a message id (state.MessageID).
const idLen = 36

// PopRequest asks for messages.
type PopRequest struct {
	Tenant           string
	Queue            string
	Partition        *string // nil: any partition
	Group            string  // "" = queue mode
	Batch            int
	Partitions       int
	LeaseSeconds     int64 // 0 = the queue's leaseTime
	AutoAck          bool
	SubscriptionMode string // "", "all", "new", "new-only"
	SubscriptionFrom string // "", "now", or RFC 3339
	Wait             bool
	Timeout          time.Duration
	// NoIDs leaves Message.ID empty, for an in-process consumer that
	// names messages by partition and offset (the PostgreSQL sink): the
	// ids are formatted for nothing otherwise.
	NoIDs bool
	// Deliveries answers with the state's records of the delivered
	// messages (PopResponse.Delivered, payloads opened) instead of a
	// Message each, for an in-process consumer that reads them once (the
	// PostgreSQL sink): a Message is built, written and collected for
	// nothing otherwise. Implies NoIDs.
	Deliveries bool
}

// Delivery is a delivered message as the state machine hands it out:
// Payload is the message's data (opened when the queue is encrypted, and
// Sealed then false), CreatedAt the push time in Unix microseconds.
type Delivery = state.Delivered

// Message is a delivered message.
type Message struct {
	ID          string
	TxID        string
	TraceID     string
	Queue       string
	Partition   string
	PartitionID uint64
	Offset      uint64
	CreatedAt   time.Time
	Data        []byte
	LeaseID     string
	Group       string
	Attempt     uint32
	Retries     uint32
}

// PopResponse is what a pop delivered; no messages means nothing to deliver.
type PopResponse struct {
	Queue    string
	Group    string
	LeaseID  string
	Claimed  int
	Messages []Message
	// Delivered holds the messages instead of Messages when the request
	// asked for Deliveries.
	Delivered []Delivery
}

// Len is the number of messages delivered.
func (r *PopResponse) Len() int { return len(r.Messages) + len(r.Delivered) }

// Pop leases messages to a consumer (or auto-acknowledges them). With Wait it
// holds until messages arrive or Timeout passes.
func (b *Broker) Pop(ctx context.Context, req PopRequest) (*PopResponse, error) {
	cmd, err := b.popCommand(req)
	if err != nil {
		return nil, err
	}
	stagetime.From(ctx).Mark(stagetime.Validated)
	var deadline <-chan time.Time
	if req.Wait {
		timeout := req.Timeout
		if timeout <= 0 {
			timeout = 30 * time.Second
		}
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	key := state.Wake{Tenant: req.Tenant, Queue: req.Queue}
	var (
		wt     *waiter
		parked bool
	)
	if req.Wait {
		// Registered before the first pop so that a push in between is
		// not missed. When the group's last long poll drained it and
		// nothing woke the queue since, the poll parks at once: its pop
		// would find nothing (waiters.park).
		wt, parked = b.waiters.park(key, cmd.Group, b.popEpoch(), req.Partition == nil)
		defer b.waiters.remove(key, wt)
	}
	for {
		var resp *PopResponse
		if parked {
			parked = false
			resp = b.emptyPop(req, cmd)
		} else {
			var epoch popEpoch
			if wt != nil {
				epoch = b.popEpoch()
				wt.popping(b.node.CommitIndex())
			}
			var (
				r   *state.PopResult
				err error
			)
			resp, r, err = b.popOnce(ctx, req, cmd)
			if wt != nil && r != nil {
				b.waiters.popped(key, cmd.Group, wt, r.At, r.Drained, epoch)
			}
			if err != nil || resp.Len() > 0 || !req.Wait {
				return resp, err
			}
		}
		select {
		case <-wt.ch:
			stagetime.From(ctx).Mark(stagetime.Woken)
		case <-deadline:
			return resp, nil
		case <-ctx.Done():
			return resp, nil
		case <-b.closing:
			return resp, nil
		}
		// A fresh lease id per attempt keeps retried proposals distinct.
		cmd.LeaseID = newID()
	}
}

func (b *Broker) popCommand(req PopRequest) (*state.Pop, error) {
	if e := ValidName("queue", req.Queue); e != nil {
		return nil, e
	}
	group := req.Group
	if group == state.QueueModeGroup {
		group = ""
	}
	if group != "" {
		if e := ValidName("consumerGroup", group); e != nil {
			return nil, e
		}
	}
	if req.Partition != nil {
		if e := ValidPartition("partition", *req.Partition); e != nil {
			return nil, e
		}
	}
	if req.Batch == 0 {
		req.Batch = 1
	}
	if req.Partitions == 0 {
		req.Partitions = 1
	}
	if e := checkRange("batch", int64(req.Batch), 1, MaxBatch); e != nil {
		return nil, e
	}
	if e := checkRange("partitions", int64(req.Partitions), 1, MaxPartitions); e != nil {
		return nil, e
	}
	if req.LeaseSeconds != 0 {
		if e := checkRange("leaseSeconds", req.LeaseSeconds, MinLeaseSeconds, MaxLeaseSeconds); e != nil {
			return nil, e
		}
	}
	if req.Wait && req.Timeout != 0 {
		if e := checkRange("timeout", req.Timeout.Milliseconds(), 1, MaxTimeoutMs); e != nil {
			return nil, e
		}
	}
	cmd := &state.Pop{Tenant: req.Tenant, Queue: req.Queue, Partition: req.Partition, Group: group,
		Batch: req.Batch, Partitions: req.Partitions, LeaseSeconds: req.LeaseSeconds, AutoAck: req.AutoAck, LeaseID: newID()}
	mode := req.SubscriptionMode
	if mode == "" && group != "" {
		mode = b.cfg.DefaultSubscriptionMode
	}
	switch mode {
	case "", "new", "new-only":
		cmd.SubMode = "new"
	case "all", "from_beginning":
		// from_beginning is how Queen's JavaScript client spells all.
		cmd.SubMode = "all"
	default:
		return nil, invalid("subscriptionMode", "subscriptionMode must be all (or from_beginning), new or new-only, got %q", mode)
	}
	if group == "" {
		cmd.SubMode = "all"
	}
	switch from := strings.TrimSpace(req.SubscriptionFrom); from {
	case "":
	case "now":
		cmd.SubFromNow = true
	default:
		t, err := time.Parse(time.RFC3339Nano, from)
		if err != nil {
			return nil, invalid("subscriptionFrom", "subscriptionFrom must be now or an RFC 3339 time, got %q", from)
		}
		cmd.SubFrom = t.UnixMicro()
		if cmd.SubFrom == 0 {
			cmd.SubFrom = 1
		}
	}
	return cmd, nil
}

// popEpoch is the leadership a long poll's pop is proposed under.
func (b *Broker) popEpoch() popEpoch {
	return popEpoch{term: b.node.LeaderTerm(), drops: b.node.SubscriptionDrops()}
}

// emptyPop is the answer of a long poll that ends before it pops: what a
// pop that found nothing answers.
func (b *Broker) emptyPop(req PopRequest, cmd *state.Pop) *PopResponse {
	group := cmd.Group
	if group == "" {
		group = state.QueueModeGroup
	}
	lease := cmd.LeaseID
	if cmd.AutoAck {
		lease = ""
	}
	return &PopResponse{Queue: req.Queue, Group: group, LeaseID: lease}
}

// popOnce proposes one pop; the state's result is returned beside the
// response unless it could not be had or was refused.
func (b *Broker) popOnce(ctx context.Context, req PopRequest, cmd *state.Pop) (*PopResponse, *state.PopResult, error) {
	v, err := b.submit(ctx, cmd, 64)
	if err != nil {
		return nil, nil, err
	}
	r, ok := v.(*state.PopResult)
	if !ok {
		return nil, nil, fmt.Errorf("pop: unexpected result %T", v)
	}
	if r.Err != nil {
		return nil, nil, fromState(r.Err)
	}
	group := cmd.Group
	if group == "" {
		group = state.QueueModeGroup
	}
	resp := &PopResponse{Queue: req.Queue, Group: group, LeaseID: r.LeaseID, Claimed: r.Claimed}
	if len(r.Messages) == 0 {
		return resp, r, nil
	}
	b.m.popped.WithLabelValues(req.Tenant, req.Queue, cmd.Group).Add(float64(len(r.Messages))) // "" in queue mode
	if req.Deliveries {
		// The result's records as they are; an encrypted queue's are
		// opened in a copy, since the result is also kept for a retried
		// request, sealed.
		resp.Delivered = r.Messages
		for i := range r.Messages {
			if !r.Messages[i].Sealed {
				continue
			}
			if &resp.Delivered[0] == &r.Messages[0] {
				resp.Delivered = slices.Clone(r.Messages)
			}
			d := &resp.Delivered[i]
			data, err := b.open(req.Queue, d.Payload, d.Sealed)
			if err != nil {
				return nil, r, err
			}
			d.Payload, d.Sealed = data, false
		}
		return resp, r, nil
	}
	resp.Messages = make([]Message, len(r.Messages))
	// The messages' ids are substrings of one string.
	var allIDs string
	if !req.NoIDs {
		ids := make([]byte, 0, idLen*len(r.Messages))
		for i := range r.Messages {
			ids = state.AppendMessageID(ids, r.Messages[i].PartitionID, r.Messages[i].Offset)
		}
		allIDs = string(ids)
	}
	for i := range r.Messages {
		d := &r.Messages[i]
		data, err := b.open(req.Queue, d.Payload, d.Sealed)
		if err != nil {
			// The messages stay leased and come back after the lease;
			// ciphertext is never served.
			return nil, r, err
		}
		var id string
		if allIDs != "" {
			id = allIDs[i*idLen : (i+1)*idLen]
		}
		resp.Messages[i] = Message{
			ID: id, TxID: d.TxID, TraceID: d.TraceID, Queue: req.Queue,
			Partition: d.Partition, PartitionID: d.PartitionID, Offset: d.Offset,
			CreatedAt: time.UnixMicro(d.CreatedAt).UTC(), Data: data, LeaseID: r.LeaseID, Group: group,
			Attempt: d.Attempt, Retries: d.Retries,
		}
	}
	return resp, r, nil
}

// AckItem acknowledges one message, named by transaction id or offset, or
// with Count a run of messages.
type AckItem struct {
	TxID        string
	PartitionID uint64
	Offset      *uint64
	Status      string
	Group       string // "" = queue mode
	LeaseID     string
	Error       string
	// Count, when more than one, acknowledges the Count messages of the
	// partition from *Offset on (no TxID), each as an item of its own with
	// the same fields would; its outcome succeeds if every one did, else
	// it holds the first error. Each message counts towards MaxBatch. A
	// caller acknowledging a lease's messages in order (the PostgreSQL
	// sink) sends one item a partition instead of one a message.
	Count uint64
}

// AckOutcome reports one acknowledgement.
type AckOutcome = state.AckItemResult

// Ack acknowledges messages; each item succeeds or fails on its own.
func (b *Broker) Ack(ctx context.Context, tenant string, items []AckItem) ([]AckOutcome, error) {
	cmd, err := ackCommand(tenant, items, "acknowledgments")
	if err != nil {
		return nil, err
	}
	stagetime.From(ctx).Mark(stagetime.Validated)
	v, err := b.submit(ctx, cmd, 64*len(items))
	if err != nil {
		return nil, err
	}
	r, ok := v.(*state.AckResult)
	if !ok {
		return nil, fmt.Errorf("ack: unexpected result %T", v)
	}
	if r.Err != nil {
		return nil, fromState(r.Err)
	}
	knownTxIDs(items, cmd.Items, r.Items)
	b.countAcks(tenant, cmd.Items, r.Items)
	return r.Items, nil
}

// knownTxIDs puts into the reply the transaction ids the command left out
// (state.AckItem.TxIDKnown): the ones the caller gave.
func knownTxIDs(items []AckItem, cmd []state.AckItem, out []AckOutcome) {
	for i := range out {
		if i < len(cmd) && cmd[i].TxIDKnown {
			out[i].TxID = items[i].TxID
		}
	}
}

func ackCommand(tenant string, items []AckItem, list string) (*state.Ack, error) {
	if len(items) == 0 {
		return nil, invalid(list, "%s must hold at least one item", list)
	}
	if len(items) > MaxBatch {
		return nil, invalid(list, "at most %d acknowledgements per request, got %d", MaxBatch, len(items))
	}
	msgs := 0
	for i := range items {
		a := &items[i]
		if a.Count <= 1 {
			msgs++
			continue
		}
		switch {
		case a.Offset == nil || a.TxID != "":
			return nil, invalid(itemField(list, i, "count"), "a run of messages is named by offset only")
		case a.Count > MaxBatch || *a.Offset+a.Count < *a.Offset:
			return nil, invalid(itemField(list, i, "count"), "count must be at most %d, got %d", MaxBatch, a.Count)
		}
		msgs += int(a.Count)
	}
	if msgs > MaxBatch {
		return nil, invalid(list, "at most %d acknowledgements per request, got %d", MaxBatch, msgs)
	}
	cmd := &state.Ack{Tenant: tenant, Items: make([]state.AckItem, len(items))}
	// Acks of a batch usually share one group: it is checked once.
	validGroup := ""
	for i := range items {
		a := &items[i]
		status := a.Status
		switch status {
		case "", "completed", "success":
			status = state.AckCompleted
		case "failed", "retry", "dlq":
		default:
			return nil, invalid(itemField(list, i, "status"), "status must be completed, success, failed, retry or dlq, got %q", a.Status)
		}
		if a.TxID == "" && a.Offset == nil {
			return nil, invalid(itemField(list, i, "transactionId"), "name the message by transactionId or offset")
		}
		if a.PartitionID == 0 {
			return nil, invalid(itemField(list, i, "partitionId"), "partitionId is required")
		}
		group := a.Group
		if group == state.QueueModeGroup {
			group = ""
		}
		if group != "" && group != validGroup {
			// The field name is built only for an error.
			if ValidName("consumerGroup", group) != nil {
				return nil, ValidName(itemField(list, i, "consumerGroup"), group)
			}
			validGroup = group
		}
		errText := a.Error
		if len(errText) > 4096 {
			errText = errText[:4096]
		}
		it := state.AckItem{PartitionID: a.PartitionID, TxID: a.TxID, Offset: a.Offset, Status: status,
			Group: group, LeaseID: a.LeaseID, Error: errText}
		if a.Count > 1 {
			it.Count = a.Count
		}
		if it.Offset != nil && it.TxID != "" {
			// The offset names the message; the transaction id is only
			// for the reply, which Ack fills in (knownTxIDs).
			it.TxID, it.TxIDKnown = "", true
		}
		cmd.Items[i] = it
	}
	return cmd, nil
}

// ExtendOutcome reports a lease extension.
type ExtendOutcome struct {
	Success   bool
	Error     string
	ExpiresAt time.Time
}

// ExtendLease extends every partition lease taken under leaseID.
func (b *Broker) ExtendLease(ctx context.Context, tenant, leaseID string, seconds int64) (*ExtendOutcome, error) {
	if seconds != 0 {
		if e := checkRange("seconds", seconds, MinLeaseSeconds, MaxLeaseSeconds); e != nil {
			return nil, e
		}
	}
	v, err := b.submit(ctx, &state.ExtendLease{Tenant: tenant, LeaseID: leaseID, Seconds: seconds}, 64)
	if err != nil {
		return nil, err
	}
	r, ok := v.(*state.ExtendResult)
	if !ok {
		return nil, fmt.Errorf("extend: unexpected result %T", v)
	}
	out := &ExtendOutcome{Success: r.Success, Error: r.Error}
	if r.ExpiresAt != 0 {
		out.ExpiresAt = time.UnixMicro(r.ExpiresAt).UTC()
	}
	return out, nil
}
