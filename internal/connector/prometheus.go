package connector

import (
	"github.com/prometheus/client_golang/prometheus"
)

// promMetrics are the connector series of one node, each labelled
// connector and tenant.
type promMetrics struct {
	counters map[string]*prometheus.CounterVec
	gauges   map[string]*prometheus.GaugeVec
}

var metricLabels = []string{"connector", "tenant"}

var counterHelp = []struct{ name, help string }{
	{"queen_pg_source_transactions_total", "PostgreSQL transactions a source pushed into Queen."},
	{"queen_pg_source_messages_total", "Messages a source pushed (changes and snapshot rows)."},
	{"queen_pg_source_bundles_total", "Queen transactions a source committed."},
	{"queen_pg_source_snapshot_rows_total", "Rows a source's snapshot read."},
	{"queen_pg_sink_applied_total", "Messages a sink wrote into its table."},
	{"queen_pg_sink_skipped_total", "Redeliveries a sink recognized by its progress table and dropped."},
	{"queen_pg_sink_dlq_total", "Messages a sink dead-lettered after maxAttempts."},
	{"queen_pg_sink_batches_total", "PostgreSQL transactions a sink committed."},
	{"queen_pg_connector_errors_total", "Errors that stopped a connector's work on this node (it retries after a backoff)."},
}

var gaugeHelp = []struct{ name, help string }{
	{"queen_pg_source_slot_lag_bytes", "WAL bytes the source's replication slot holds that the source has not confirmed."},
	{"queen_pg_source_pointer_lsn", "The source's pointer: the WAL position its committed messages reach, as a number."},
	{"queen_pg_connector_owner", "1 on the node running the connector's work (a source's owner; every node running a sink), else 0."},
}

func newPromMetrics() *promMetrics {
	m := &promMetrics{counters: map[string]*prometheus.CounterVec{}, gauges: map[string]*prometheus.GaugeVec{}}
	for _, c := range counterHelp {
		m.counters[c.name] = prometheus.NewCounterVec(prometheus.CounterOpts{Name: c.name, Help: c.help}, metricLabels)
	}
	for _, g := range gaugeHelp {
		m.gauges[g.name] = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: g.name, Help: g.help}, metricLabels)
	}
	return m
}

func (m *promMetrics) register(reg prometheus.Registerer) error {
	for _, c := range m.counters {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	for _, g := range m.gauges {
		if err := reg.Register(g); err != nil {
			return err
		}
	}
	return nil
}

// forConnector are one connector's series. Every series exists from the
// connector's start, at 0, so a dashboard sees it before its first event.
func (m *promMetrics) forConnector(name, tenant string) *ConnectorMetrics {
	c := func(n string) Counter { return m.counters[n].WithLabelValues(name, tenant) }
	g := func(n string) Gauge { return m.gauges[n].WithLabelValues(name, tenant) }
	return &ConnectorMetrics{
		SourceTransactions: c("queen_pg_source_transactions_total"),
		SourceMessages:     c("queen_pg_source_messages_total"),
		SourceBundles:      c("queen_pg_source_bundles_total"),
		SourceSnapshotRows: c("queen_pg_source_snapshot_rows_total"),
		SourceSlotLagBytes: g("queen_pg_source_slot_lag_bytes"),
		SourcePointerLSN:   g("queen_pg_source_pointer_lsn"),
		SinkApplied:        c("queen_pg_sink_applied_total"),
		SinkSkipped:        c("queen_pg_sink_skipped_total"),
		SinkDLQ:            c("queen_pg_sink_dlq_total"),
		SinkBatches:        c("queen_pg_sink_batches_total"),
		Errors:             c("queen_pg_connector_errors_total"),
		Owner:              g("queen_pg_connector_owner"),
	}
}

// drop removes a deleted connector's series.
func (m *promMetrics) drop(name, tenant string) {
	for _, c := range m.counters {
		c.DeleteLabelValues(name, tenant)
	}
	for _, g := range m.gauges {
		g.DeleteLabelValues(name, tenant)
	}
}
