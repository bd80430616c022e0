package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/queen-mq/queen/internal/state"
)

// QueueOptions are a queue's settings (state.QueueOptions).
type QueueOptions = state.QueueOptions

// ConfigureRequest creates or updates a queue; Options holds only the
// options the caller named (raw JSON values).
type ConfigureRequest struct {
	Tenant    string
	Queue     string
	Namespace *string
	Task      *string
	Options   map[string]json.RawMessage
}

// ConfigureOutcome is a queue's settings after Configure.
type ConfigureOutcome struct {
	Options   QueueOptions
	Namespace string
	Task      string
}

// Configure creates or updates a queue.
func (b *Broker) Configure(ctx context.Context, req ConfigureRequest) (*ConfigureOutcome, error) {
	if e := ValidName("queue", req.Queue); e != nil {
		return nil, e
	}
	if e := validConfigure(req); e != nil {
		return nil, e
	}
	// Validate here too, so a bad option is refused before it reaches the log.
	probe := state.DefaultQueueOptions()
	if field, err := state.ApplyOptions(&probe, req.Options); err != nil {
		return nil, invalid("options."+field, "%v", err)
	}
	if probe.EncryptionEnabled && b.sealer == nil {
		return nil, &Error{Code: "encryption_key_missing", Field: "options.encryptionEnabled",
			Message: "encryptionEnabled needs QUEEN_ENCRYPTION_KEY (64 hex characters) on every node; set it and restart"}
	}
	v, err := b.submit(ctx, &state.Configure{Tenant: req.Tenant, Queue: req.Queue, Namespace: req.Namespace, Task: req.Task, Options: req.Options}, 256)
	if err != nil {
		return nil, err
	}
	r, ok := v.(*state.ConfigureResult)
	if !ok {
		return nil, fmt.Errorf("configure: unexpected result %T", v)
	}
	if r.Err != nil {
		return nil, fromState(r.Err)
	}
	return &ConfigureOutcome{Options: r.Options, Namespace: r.Namespace, Task: r.Task}, nil
}

func (b *Broker) count(ctx context.Context, cmd state.Command) (*state.CountResult, error) {
	v, err := b.submit(ctx, cmd, 128)
	if err != nil {
		return nil, err
	}
	r, ok := v.(*state.CountResult)
	if !ok {
		return nil, fmt.Errorf("%T: unexpected result %T", cmd, v)
	}
	if r.Err != nil {
		return nil, fromState(r.Err)
	}
	return r, nil
}

// DeleteQueue removes a queue and everything in it. It reports whether the
// queue existed.
func (b *Broker) DeleteQueue(ctx context.Context, tenant, queue string) (bool, error) {
	if e := ValidName("queue", queue); e != nil {
		return false, e
	}
	r, err := b.count(ctx, &state.DeleteQueue{Tenant: tenant, Queue: queue})
	if err != nil {
		return false, err
	}
	return r.Found, nil
}

// SeekRequest moves a group's position in one queue (or all it reads).
type SeekRequest struct {
	Tenant  string
	Group   string
	Queue   string
	ToEnd   bool
	ToStart bool
	Time    time.Time
}

// Seek moves a group's position. It reports how many subscriptions moved.
func (b *Broker) Seek(ctx context.Context, req SeekRequest) (int, error) {
	if e := ValidName("consumerGroup", req.Group); e != nil && req.Group != state.QueueModeGroup {
		return 0, e
	}
	if req.Queue != "" {
		if e := ValidName("queue", req.Queue); e != nil {
			return 0, e
		}
	}
	n := 0
	if req.ToEnd {
		n++
	}
	if req.ToStart {
		n++
	}
	if !req.Time.IsZero() {
		n++
	}
	if n != 1 {
		return 0, invalid("", "give exactly one of toEnd, toStart or timestamp")
	}
	cmd := &state.Seek{Tenant: req.Tenant, Group: req.Group, Queue: req.Queue, ToEnd: req.ToEnd, ToStart: req.ToStart}
	if !req.Time.IsZero() {
		cmd.Time = req.Time.UnixMicro()
	}
	r, err := b.count(ctx, cmd)
	if err != nil {
		return 0, err
	}
	return r.Count, nil
}

// DeleteGroup removes a group's subscription to one queue, or to all queues
// when queue is "". It reports how many were removed.
func (b *Broker) DeleteGroup(ctx context.Context, tenant, group, queue string) (int, error) {
	if e := ValidName("consumerGroup", group); e != nil && group != state.QueueModeGroup {
		return 0, e
	}
	r, err := b.count(ctx, &state.DeleteGroup{Tenant: tenant, Group: group, Queue: queue})
	if err != nil {
		return 0, err
	}
	return r.Count, nil
}

// RequeueDLQ makes dead-lettered messages available again to their group.
func (b *Broker) RequeueDLQ(ctx context.Context, tenant, queue, group string, ids []string) (int, error) {
	if e := ValidName("queue", queue); e != nil {
		return 0, e
	}
	if len(ids) == 0 {
		return 0, invalid("ids", "ids must name at least one dead-lettered message")
	}
	for i, id := range ids {
		if _, _, err := state.ParseMessageID(id); err != nil {
			return 0, invalid(fmt.Sprintf("ids[%d]", i), "%v", err)
		}
	}
	r, err := b.count(ctx, &state.DLQRequeue{Tenant: tenant, Queue: queue, Group: groupOrQueueMode(group), IDs: ids})
	if err != nil {
		return 0, err
	}
	return r.Count, nil
}

// DeleteDLQ empties a group's dead-letter queue for a queue.
func (b *Broker) DeleteDLQ(ctx context.Context, tenant, queue, group string) (int, error) {
	if e := ValidName("queue", queue); e != nil {
		return 0, e
	}
	r, err := b.count(ctx, &state.DLQDelete{Tenant: tenant, Queue: queue, Group: groupOrQueueMode(group)})
	if err != nil {
		return 0, err
	}
	return r.Count, nil
}

func groupOrQueueMode(g string) string {
	if g == "" {
		return state.QueueModeGroup
	}
	return g
}

// Reads. Every read is linearizable: it sees every write acknowledged before
// it started.

// Queues lists a tenant's queues.
func (b *Broker) Queues(ctx context.Context, tenant string) ([]state.QueueInfo, error) {
	r, err := b.reader(ctx)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return r.Queues(tenant), nil
}

// QueueDetail describes a queue and a page of its partitions.
func (b *Broker) QueueDetail(ctx context.Context, tenant, queue string, afterPartition uint64, limit int) (*state.QueueInfo, []state.PartitionInfo, error) {
	r, err := b.reader(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer r.Close()
	qi, ok := r.Queue(tenant, queue)
	if !ok {
		return nil, nil, nil
	}
	parts, _ := r.Partitions(tenant, queue, afterPartition, limit, time.Now().UnixMicro())
	return &qi, parts, nil
}

// Groups lists group subscriptions (of one group when group is not "").
func (b *Broker) Groups(ctx context.Context, tenant, group string) ([]state.GroupQueue, error) {
	r, err := b.reader(ctx)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return r.Groups(tenant, group), nil
}

// GroupPartitions lists a group's position in each partition of a queue.
func (b *Broker) GroupPartitions(ctx context.Context, tenant, group, queue string, after uint64, limit int) ([]state.PartitionInfo, error) {
	r, err := b.reader(ctx)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return r.GroupPartitions(tenant, group, queue, after, limit, time.Now().UnixMicro()), nil
}

// DLQ lists dead letters.
func (b *Broker) DLQ(ctx context.Context, tenant, queue, group, partition string, limit, offset int) ([]state.DeadLetter, int, error) {
	r, err := b.reader(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer r.Close()
	list, total, err := r.DLQ(tenant, queue, group, partition, limit, offset)
	if err != nil {
		return nil, 0, err
	}
	for i := range list {
		if list[i].Sealed {
			plain, err := b.open(list[i].Queue, list[i].Payload, true)
			if err != nil {
				return nil, 0, err
			}
			list[i].Payload, list[i].Sealed = plain, false
		}
	}
	return list, total, nil
}

// Stats summarizes a tenant's state (served locally, possibly stale).
func (b *Broker) Stats(tenant string) state.Stats {
	r := b.node.Store().Reader()
	defer r.Close()
	return r.Stats(tenant)
}

// MessageID is the wire id of the message at (partition, offset).
func MessageID(partition, offset uint64) string { return state.MessageID(partition, offset) }
