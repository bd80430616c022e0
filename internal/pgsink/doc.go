// Package pgsink is the PostgreSQL sink: a consumer group the broker runs
// itself that writes every message of a queue into a table, exactly once.
//
// Each worker pops a batch with its own lease and applies it in one
// PostgreSQL transaction that also moves the batch's partitions in the
// progress table; the transaction commits without waiting for the WAL
// flush, and the batch is acked only after a later commit that waits for
// it (a barrier, one per group of batches) made it durable.
// A redelivered message is at or below its partition's recorded offset and
// is dropped, so a crash, a lost ack or two nodes holding one partition
// never write a message twice. The package owns the start checks of a sink
// document against its table, the mapping of a message onto columns in the
// four modes (append, upsert, cdc, sql), and the handling of refused
// messages (retried, then dead-lettered) and of transient failures
// (retried with backoff).
package pgsink
