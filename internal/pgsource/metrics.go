package pgsource

import "github.com/queen-mq/queen/internal/connector"

type nop struct{}

func (nop) Add(float64) {}
func (nop) Set(float64) {}

// nopMetrics stands in when the runtime hands no metrics (tests).
func nopMetrics() *connector.ConnectorMetrics {
	n := nop{}
	return &connector.ConnectorMetrics{
		SourceTransactions: n, SourceMessages: n, SourceBundles: n, SourceSnapshotRows: n,
		SourceSlotLagBytes: n, SourcePointerLSN: n, SinkApplied: n, SinkSkipped: n, SinkDLQ: n,
		SinkBatches: n, Errors: n, Owner: n,
	}
}
