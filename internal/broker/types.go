package broker

import "github.com/queen-mq/queen/internal/state"

// Read views of the broker's API. They are the state store's own types,
// named here so that callers of the broker need not import the store.
type (
	QueueInfo     = state.QueueInfo
	PartitionInfo = state.PartitionInfo
	GroupQueue    = state.GroupQueue
	KVEntry       = state.KVEntry
)
