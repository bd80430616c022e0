// Package state owns the broker's replicated state: the Pebble key layout, the
// encodings of every record, the commands that change state and their
// deterministic Apply, and the read queries the broker answers from.
//
// Nothing in this package reads a clock, draws random numbers or depends on map
// order: applying the same entries to two empty stores yields identical keys and
// values. See docs/design/state.md for the layout and the decisions behind it.
//
// A storage error or an undecodable record inside Apply halts the store
// (fault.go, docs/design/durability.md): it never guesses.
//
// Files:
//   - store.go: Store, Options, Open (Pebble's options) and Close,
//     Checkpoint and Replace (snapshots), the applied index and deadline.
//   - apply_batch.go: ApplyBatch, the commit that runs while the caller
//     hands out results, and applyCtx, the working state of one batch
//     (dispatch to the commands, dirty records flushed in key order).
//   - batch_io.go: the batch's reads, writes and iterators; a storage
//     error stops the batch.
//   - access_queues.go, access_partitions.go, access_subscriptions.go,
//     access_cursors.go: applyCtx's cached accessors of tenants and
//     queues, partitions (and offset search), subscriptions (and start
//     rules), cursors and the ready index.
//   - cache.go: the record cache kept across batches, and the in-memory
//     mirror of the ready index; settled.go: the cursors with nothing in
//     flight, cached as values.
//   - encrypted.go: the index of encrypted queues.
//   - name_filter.go: a per-queue filter of partition names, so that a
//     push to a new partition skips the read.
//   - apply_push.go, apply_pop.go, apply_ack.go (also lease extension and
//     Tick), apply_admin.go (configure, delete, seek, dead letters),
//     apply_txn.go (Txn and its operations): each command's Apply.
//   - retention.go: retention by age and count, by whole ranges.
//   - command.go, codec.go: the commands and their log encoding.
//   - keys.go, records.go: the key layout and the record encodings.
//   - kv.go: the key-value table and its reads.
//   - reads.go: Reader, the queries answered from a snapshot.
//   - blobs.go: large payloads leave the LSM's tables (value separation).
//   - table_spans.go: Pebble's output tables cut at the key space's table boundaries.
//   - fault.go: ApplyError and halting.
//   - memory.go: the memory budget the store was opened with.
package state
