package broker

import (
	"context"
	"fmt"
)

// WaitSynced returns once every write this broker acknowledged before the
// call is on disk in the raft logs of a majority of the cluster's voters.
// With QUEEN_FSYNC=always that is true of every acknowledged write (a
// pop's lease aside, whose loss is its expiry) and it returns at once;
// with QUEEN_FSYNC=interval it waits for the next sync of
// those logs (each node is asked to sync early). A caller that hands on a
// promise based on a write (a connector source confirming a position to
// PostgreSQL) must call it after the write and before the promise.
func (b *Broker) WaitSynced(ctx context.Context) error {
	if err := b.node.WaitSynced(ctx); err != nil {
		return fmt.Errorf("wait until acknowledged writes are on disk: %w", err)
	}
	return nil
}

// Synced is the raft log index through which this node's log is on disk.
func (b *Broker) Synced() uint64 { return b.node.Synced() }

// Durability is the durability setting in force: "always" or "interval".
func (b *Broker) Durability() string { return string(b.node.Fsync()) }
