package state

// Start rules of a subscription.
const (
	StartAll   = "all"   // from the oldest retained message
	StartIndex = "index" // from messages applied after log index N
	StartTime  = "time"  // from the first message created at or after T
)

// subRec is a consumer group's subscription to one queue.
type subRec struct {
	ID        uint64 `json:"id"`
	Group     string `json:"group"`
	CreatedAt int64  `json:"createdAt"`
	Epoch     uint64 `json:"epoch"`
	Rule      string `json:"rule"`
	RuleIndex uint64 `json:"ruleIndex,omitempty"`
	RuleTime  int64  `json:"ruleTime,omitempty"`
	Pending   int64  `json:"pending"`  // messages not finished by this group
	Consumed  int64  `json:"consumed"` // messages finished (acked, auto-acked)
	DLQ       int64  `json:"dlq"`      // messages in its dead-letter queue
	Skipped   int64  `json:"skipped"`  // messages lost to retention before consumption
	ScanPos   uint64 `json:"scanPos"`  // round-robin position in the ready index
	// Backfill is true while existing partitions still need to be checked for
	// work; BackfillPos is the next partition id to check.
	Backfill    bool   `json:"backfill,omitempty"`
	BackfillPos uint64 `json:"backfillPos,omitempty"`
}
