// Package stages measures where a push and a pop+ack spend their time on
// the server, stage by stage, with the hooks of internal/stagetime: one
// node and three nodes in this process (real raft, real raft-wal with its
// fsync, real Pebble, real HTTP over loopback), closed-loop clients.
//
// Run with: make bench-stages, or
//
//	go test ./tests/stages -run '^$' -bench Stages -benchtime 1x -timeout 30m
//
// QUEEN_STAGES_SECONDS (default 4) is each case's measured window,
// QUEEN_STAGES_CLIENTS (default 1,4,16) the client counts,
// QUEEN_STAGES_NODES (default 1,3) the cluster sizes, QUEEN_STAGES_FSYNC
// (always or interval) the raft log's durability setting, and
// QUEEN_STAGES_OVERHEAD=1 adds a run that measures the timing's own cost.
// The tables are printed in the format of docs/benchmarks.md;
// docs/design/performance.md reads them.
//
// BenchmarkDeliverStages (go test ./tests/stages -run '^$' -bench
// DeliverStages -benchtime 1x) runs the bench's latency scenario instead:
// 1,000 one-message pushes a second and one consumer long-polling, and
// attributes each delivery's latency to the stages of the pop that
// delivered it, with the slowest deliveries stage by stage.
// QUEEN_STAGES_ACK picks the consumer: explicit (the default, as the
// bench's -latency-ack explicit: leasing pops, each batch acknowledged
// after receipt, in order, on a connection of its own), pipelined (the
// same, but each ack sent at once beside those not yet answered) or none
// (autoAck). With a leasing consumer it also finds the deliveries that
// waited for the previous batch's lease, and cuts their path through that
// batch's ack. QUEEN_STAGES_PARTITIONS spreads the pushes over partitions.
package stages
