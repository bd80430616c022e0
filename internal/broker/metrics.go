package broker

import (
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/queen-mq/queen/internal/state"
)

// metrics are the broker's Prometheus metrics. Counts that state already
// holds (depth, lag, dead letters, retention) are read at scrape time from
// the counters in state; operation counters and latencies are kept here, per
// node.
type metrics struct {
	pushed *prometheus.CounterVec
	// pushedBy caches pushed's counter of each tenant and queue: a
	// label lookup allocates and hashes the labels on every push.
	pushedMu sync.RWMutex
	pushedBy map[[2]string]prometheus.Counter
	popped   *prometheus.CounterVec
	acked    *prometheus.CounterVec
	applyLat prometheus.Histogram
}

func newMetrics() *metrics {
	return &metrics{
		pushedBy: map[[2]string]prometheus.Counter{},
		pushed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "queen_messages_pushed_total",
			Help: "Messages stored by pushes on this node (duplicates excluded)."}, []string{"tenant", "queue"}),
		popped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "queen_messages_popped_total",
			Help: "Messages delivered by pops on this node."}, []string{"tenant", "queue", "group"}),
		acked: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "queen_acks_total",
			Help: "Acknowledgements applied on this node, by status."}, []string{"tenant", "status"}),
		applyLat: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "queen_raft_submit_seconds",
			Help:    "Time from proposing a command to its result (log append, fsync, apply).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
	}
}

// Register adds the broker's metrics to a registry.
func (b *Broker) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{b.m.pushed, b.m.popped, b.m.acked, b.m.applyLat, &stateCollector{b: b}} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

var (
	descDepth     = prometheus.NewDesc("queen_queue_messages", "Messages retained in a queue.", []string{"tenant", "queue"}, nil)
	descPending   = prometheus.NewDesc("queen_queue_pending_messages", "Messages not yet finished in queue mode.", []string{"tenant", "queue"}, nil)
	descPendSec   = prometheus.NewDesc("queen_queue_pending_seconds", "Age of the oldest message not finished in queue mode (over at most 1000 partitions with work and 1000 read).", []string{"tenant", "queue"}, nil)
	descQueueDLQ  = prometheus.NewDesc("queen_queue_dead_letters", "Messages in queue mode's dead-letter queue.", []string{"tenant", "queue"}, nil)
	descParts     = prometheus.NewDesc("queen_queue_partitions", "Partitions of a queue.", []string{"tenant", "queue"}, nil)
	descRetention = prometheus.NewDesc("queen_retention_deleted_messages_total", "Messages removed by retention.", []string{"tenant", "queue"}, nil)
	descLag       = prometheus.NewDesc("queen_group_lag_messages", "Messages a consumer group has not finished.", []string{"tenant", "queue", "group"}, nil)
	descLagSec    = prometheus.NewDesc("queen_group_lag_seconds", "Age of the oldest message a group has not finished (over at most 1000 partitions with work and 1000 read).", []string{"tenant", "queue", "group"}, nil)
	descConsumed  = prometheus.NewDesc("queen_group_consumed_messages_total", "Messages a group finished.", []string{"tenant", "queue", "group"}, nil)
	descDLQ       = prometheus.NewDesc("queen_group_dead_letters", "Messages in a group's dead-letter queue.", []string{"tenant", "queue", "group"}, nil)
	descSkipped   = prometheus.NewDesc("queen_group_skipped_messages_total", "Messages removed by retention before the group finished them.", []string{"tenant", "queue", "group"}, nil)
	descTerm      = prometheus.NewDesc("queen_raft_term", "Current Raft term.", nil, nil)
	descCommit    = prometheus.NewDesc("queen_raft_commit_index", "Raft commit index.", nil, nil)
	descApplied   = prometheus.NewDesc("queen_raft_applied_index", "Index of the last entry applied to state.", nil, nil)
	descLeader    = prometheus.NewDesc("queen_raft_leader", "1 when this node leads.", nil, nil)
	descDiskFree  = prometheus.NewDesc("queen_data_dir_free_bytes", "Free bytes of the disk that holds the data directory.", nil, nil)
	descReadOnly  = prometheus.NewDesc("queen_read_only", "1 while this node refuses writes because its data directory's disk is below QUEEN_DISK_RESERVE_BYTES free.", nil, nil)
	descStopped   = prometheus.NewDesc("queen_node_stopped", "1 once this node stopped applying the log (a storage error, or an entry of a newer version).", nil, nil)
	descCacheSize = prometheus.NewDesc("queen_storage_block_cache_bytes", "Bytes of blocks held in the storage engine's block cache.", nil, nil)
	descCacheHit  = prometheus.NewDesc("queen_storage_block_cache_hits_total", "Block reads the storage engine's block cache served.", nil, nil)
	descCacheMiss = prometheus.NewDesc("queen_storage_block_cache_misses_total", "Block reads that went to the files (not in the block cache).", nil, nil)
	descRetryReqs = prometheus.NewDesc("queen_retry_index_requests", "Applied requests whose results this node keeps to answer a retry of them with the same result.", nil, nil)
	descRetryMem  = prometheus.NewDesc("queen_retry_index_bytes", "Memory those results are counted at (bounded by a thirty-second of QUEEN_MEMORY_LIMIT).", nil, nil)
	descRetryWin  = prometheus.NewDesc("queen_retry_index_window_seconds", "Age of the oldest request whose result is kept: a retry older than this is not answered from the index.", nil, nil)
)

// stateCollector reads state counters at scrape time.
type stateCollector struct{ b *Broker }

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDepth, descPending, descPendSec, descQueueDLQ, descParts, descRetention, descLag, descLagSec, descConsumed, descDLQ, descSkipped, descTerm, descCommit, descApplied, descLeader, descDiskFree, descReadOnly, descStopped, descCacheSize, descCacheHit, descCacheMiss, descRetryReqs, descRetryMem, descRetryWin} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.b.node
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	gauge(descTerm, float64(n.Term()))
	gauge(descCommit, float64(n.CommitIndex()))
	gauge(descApplied, float64(n.Store().AppliedIndex()))
	leader := 0.0
	if n.IsLeader() {
		leader = 1
	}
	gauge(descLeader, leader)
	gauge(descDiskFree, float64(n.DataDirFreeBytes()))
	gauge(descReadOnly, boolGauge(n.ReadOnly()))
	gauge(descStopped, boolGauge(n.HaltError() != nil))
	bc := n.Store().BlockCache()
	gauge(descCacheSize, float64(bc.Bytes))
	counter(descCacheHit, float64(bc.Hits))
	counter(descCacheMiss, float64(bc.Misses))
	ri := n.RetryIndex()
	gauge(descRetryReqs, float64(ri.Requests))
	gauge(descRetryMem, float64(ri.Bytes))
	gauge(descRetryWin, ri.Window.Seconds())
	if n.HaltError() != nil {
		return // the store may be inconsistent; it serves nothing more
	}
	r := n.Store().Reader()
	defer r.Close()
	now := time.Now().UnixMicro()
	for _, tenant := range r.Tenants() {
		for _, q := range r.Queues(tenant) {
			gauge(descDepth, float64(q.Total), tenant, q.Name)
			gauge(descPending, float64(q.Pending), tenant, q.Name)
			gauge(descParts, float64(q.Partitions), tenant, q.Name)
			counter(descRetention, float64(q.Deleted), tenant, q.Name)
		}
		for _, g := range r.Groups(tenant, "") {
			if g.Group == state.QueueModeGroup {
				// Queue mode is reported per queue, so that an alert on
				// group lag fires only for named consumer groups.
				gauge(descPendSec, r.GroupLagSeconds(tenant, g.Queue, g.Group, now, 1000), tenant, g.Queue)
				gauge(descQueueDLQ, float64(g.DLQ), tenant, g.Queue)
				continue
			}
			gauge(descLag, float64(g.Pending), tenant, g.Queue, g.Group)
			counter(descConsumed, float64(g.Consumed), tenant, g.Queue, g.Group)
			gauge(descDLQ, float64(g.DLQ), tenant, g.Queue, g.Group)
			counter(descSkipped, float64(g.Skipped), tenant, g.Queue, g.Group)
			gauge(descLagSec, r.GroupLagSeconds(tenant, g.Queue, g.Group, now, 1000), tenant, g.Queue, g.Group)
		}
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// countPush counts stored messages per queue.
func (b *Broker) countPush(tenant string, out []PushOutcome) {
	b.countRuns(tenant, len(out), func(i int) (string, bool) { return out[i].Queue, out[i].Duplicate })
}

// countRuns counts the n messages that at names (queue, duplicate) per
// queue, duplicates left out. Runs of one label are added at once: a label
// lookup costs more than the rest of the count.
func (b *Broker) countRuns(tenant string, n int, at func(i int) (queue string, dup bool)) {
	run, k := "", 0
	for i := 0; i < n; i++ {
		q, dup := at(i)
		if dup {
			continue
		}
		if k > 0 && q != run {
			b.m.pushedFor(tenant, run).Add(float64(k))
			k = 0
		}
		run = q
		k++
	}
	if k > 0 {
		b.m.pushedFor(tenant, run).Add(float64(k))
	}
}

// pushedFor is pushed's counter of tenant and queue.
func (m *metrics) pushedFor(tenant, queue string) prometheus.Counter {
	k := [2]string{tenant, queue}
	m.pushedMu.RLock()
	c := m.pushedBy[k]
	m.pushedMu.RUnlock()
	if c != nil {
		return c
	}
	// The names may be slices of a request's pooled body: the key keeps
	// copies.
	k = [2]string{strings.Clone(tenant), strings.Clone(queue)}
	c = m.pushed.WithLabelValues(k[0], k[1])
	m.pushedMu.Lock()
	m.pushedBy[k] = c
	m.pushedMu.Unlock()
	return c
}

func (b *Broker) observeSubmit(start time.Time) { b.m.applyLat.Observe(time.Since(start).Seconds()) }

// countAcks counts successful acknowledgements per status, a run at a time
// like countPush. An item of several offsets (AckItem.Count) counts them
// all when it succeeded, none when one of them was refused.
func (b *Broker) countAcks(tenant string, items []state.AckItem, out []AckOutcome) {
	run, n := "", 0
	for i, o := range out {
		if !o.Success || i >= len(items) {
			continue
		}
		if n > 0 && items[i].Status != run {
			b.m.acked.WithLabelValues(tenant, run).Add(float64(n))
			n = 0
		}
		run = items[i].Status
		n += max(1, int(items[i].Count)) // a run's messages (AckItem.Count)
	}
	if n > 0 {
		b.m.acked.WithLabelValues(tenant, run).Add(float64(n))
	}
}

// countTxn counts a committed transaction's pushes and acks as a push and
// an ack request would be counted.
func (b *Broker) countTxn(cmd *state.Txn, out []TxnOpOutcome) {
	for i, o := range out {
		switch o.Type {
		case OpPush:
			b.countPush(cmd.Tenant, o.Push)
		case OpAck:
			b.countAcks(cmd.Tenant, []state.AckItem{cmd.Ops[i].Ack}, []AckOutcome{o.Ack})
		}
	}
}
