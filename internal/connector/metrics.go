package connector

// ConnectorMetrics are one connector's counters and gauges (the spec's
// queen_pg_* series, labelled connector and tenant). The runtime creates
// them per connector; a nil field is never handed out.
type ConnectorMetrics struct {
	SourceTransactions Counter // queen_pg_source_transactions_total
	SourceMessages     Counter // queen_pg_source_messages_total
	SourceBundles      Counter // queen_pg_source_bundles_total
	SourceSnapshotRows Counter // queen_pg_source_snapshot_rows_total
	SourceSlotLagBytes Gauge   // queen_pg_source_slot_lag_bytes
	SourcePointerLSN   Gauge   // queen_pg_source_pointer_lsn
	SinkApplied        Counter // queen_pg_sink_applied_total
	SinkSkipped        Counter // queen_pg_sink_skipped_total
	SinkDLQ            Counter // queen_pg_sink_dlq_total
	SinkBatches        Counter // queen_pg_sink_batches_total
	Errors             Counter // queen_pg_connector_errors_total
	Owner              Gauge   // queen_pg_connector_owner
}

// Counter is the part of a Prometheus counter a connector uses.
type Counter interface{ Add(float64) }

// Gauge is the part of a Prometheus gauge a connector uses.
type Gauge interface{ Set(float64) }
