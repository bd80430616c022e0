package state

import (
	"encoding/binary"
	"encoding/json"
)

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

// appendTo appends the binary encoding of s to b.
//
// Version 1 (the first byte 1, where a record of JSON starts with "{") is
// the fields in order, integers as varints: about 40 bytes, encoded without
// reflection. Pops and acks rewrite a group's record once a batch, and
// encoding/json cost them a few percent of the process. Records of JSON
// (every build before) are still read and are rewritten as version 1 at
// their next change; docs/design/state.md, "What a pop and an ack cost per
// message", says what older builds do with version 1.
func (s *subRec) appendTo(b []byte) []byte {
	e := enc{b: b}
	e.u8(1)
	e.uv(s.ID)
	e.str(s.Group)
	e.b = binary.AppendVarint(e.b, s.CreatedAt)
	e.uv(s.Epoch)
	e.str(s.Rule)
	e.uv(s.RuleIndex)
	e.b = binary.AppendVarint(e.b, s.RuleTime)
	e.b = binary.AppendVarint(e.b, s.Pending)
	e.b = binary.AppendVarint(e.b, s.Consumed)
	e.b = binary.AppendVarint(e.b, s.DLQ)
	e.b = binary.AppendVarint(e.b, s.Skipped)
	e.uv(s.ScanPos)
	e.bool(s.Backfill)
	e.uv(s.BackfillPos)
	return e.b
}

// decodeSub decodes a subscription record of either encoding.
func decodeSub(b []byte) (*subRec, error) {
	s := &subRec{}
	if len(b) > 0 && b[0] == '{' {
		if err := json.Unmarshal(b, s); err != nil {
			return nil, err
		}
		return s, nil
	}
	d := dec{b: b}
	if d.u8() != 1 {
		return nil, errCorrupt
	}
	s.ID = d.uv()
	s.Group = d.str()
	s.CreatedAt = d.sv()
	s.Epoch = d.uv()
	s.Rule = d.str()
	s.RuleIndex = d.uv()
	s.RuleTime = d.sv()
	s.Pending = d.sv()
	s.Consumed = d.sv()
	s.DLQ = d.sv()
	s.Skipped = d.sv()
	s.ScanPos = d.uv()
	s.Backfill = d.bool()
	s.BackfillPos = d.uv()
	if d.err == nil && len(d.b) != 0 {
		return nil, errCorrupt
	}
	return s, d.err
}
