package state

// The packed encoding of an Ack (kindAckPacked). The items of an ack mostly
// repeat the one before: the same partition, group, lease and status, and
// the next offset. Each item starts with a flags byte saying which fields
// repeat, and holds only the others; an ack of a lease's messages by offset
// is a byte per message (the flags are a uvarint, the common ones in its
// first seven bits).
//
//	tenant str, n uv, then n times:
//	flags uv
//	partition u64          unless ackSamePart
//	offset uv              if ackHasOffset and not ackNextOffset
//	status str             unless ackSameStatus
//	group str              unless ackSameGroup
//	lease str              unless ackSameLease
//	txid str               if ackHasTxID
//	error str              if ackHasError
//	count uv               if ackHasCount (kindAckRuns only)
//
// "The one before" starts as partition 0, no offset and empty strings; its
// offset is the last one it acknowledged (a run's last).
const (
	ackSamePart   = 1 << 0
	ackHasOffset  = 1 << 1
	ackNextOffset = 1 << 2 // the offset is the previous item's plus one
	ackSameStatus = 1 << 3
	ackSameGroup  = 1 << 4
	ackSameLease  = 1 << 5
	ackHasTxID    = 1 << 6
	ackTxIDKnown  = 1 << 7 // AckItem.TxIDKnown
	ackHasError   = 1 << 8
	ackHasCount   = 1 << 9 // AckItem.Count > 1: a run, from the offset on
)

func encodeAckPacked(c *Ack) []byte {
	size := strSize(len(c.Tenant)) + uvSize(uint64(len(c.Items)))
	for i := range c.Items {
		a := &c.Items[i]
		size += 2 + 8 + 10 + strSize(len(a.TxID)) + strSize(len(a.Error)) + 10
		if i == 0 || a.Status != c.Items[i-1].Status || a.Group != c.Items[i-1].Group || a.LeaseID != c.Items[i-1].LeaseID {
			size += strSize(len(a.Status)) + strSize(len(a.Group)) + strSize(len(a.LeaseID))
		}
	}
	e := enc{b: make([]byte, 0, size)}
	e.str(c.Tenant)
	e.uv(uint64(len(c.Items)))
	var prev AckItem
	prevOff, hasPrevOff := uint64(0), false
	for i := range c.Items {
		a := &c.Items[i]
		var f uint64
		if a.PartitionID == prev.PartitionID {
			f |= ackSamePart
		}
		if a.Offset != nil {
			f |= ackHasOffset
			if hasPrevOff && f&ackSamePart != 0 && *a.Offset == prevOff+1 {
				f |= ackNextOffset
			}
		}
		if a.Status == prev.Status {
			f |= ackSameStatus
		}
		if a.Group == prev.Group {
			f |= ackSameGroup
		}
		if a.LeaseID == prev.LeaseID {
			f |= ackSameLease
		}
		if a.TxID != "" {
			f |= ackHasTxID
		}
		if a.TxIDKnown {
			f |= ackTxIDKnown
		}
		if a.Error != "" {
			f |= ackHasError
		}
		if a.Count > 1 {
			f |= ackHasCount
		}
		e.uv(f)
		if f&ackSamePart == 0 {
			e.u64(a.PartitionID)
		}
		if f&(ackHasOffset|ackNextOffset) == ackHasOffset {
			e.uv(*a.Offset)
		}
		if f&ackSameStatus == 0 {
			e.str(a.Status)
		}
		if f&ackSameGroup == 0 {
			e.str(a.Group)
		}
		if f&ackSameLease == 0 {
			e.str(a.LeaseID)
		}
		if f&ackHasTxID != 0 {
			e.str(a.TxID)
		}
		if f&ackHasError != 0 {
			e.str(a.Error)
		}
		if f&ackHasCount != 0 {
			e.uv(a.Count)
		}
		prev = *a
		hasPrevOff = a.Offset != nil
		if hasPrevOff {
			prevOff = *a.Offset
			if a.Count > 1 {
				prevOff += a.Count - 1
			}
		}
	}
	return e.b
}

// decodeAckPacked decodes encodeAckPacked (strings and offsets as
// decodeAckHead says; a repeated string is the same string); runs says the
// entry's kind is kindAckRuns, whose items may have a count.
func decodeAckPacked(b []byte, runs bool) (*Ack, error) {
	c, d, str, offs, err := decodeAckHead(b)
	if err != nil {
		return nil, err
	}
	var prev AckItem
	prevOff, hasPrevOff := uint64(0), false
	for i := range c.Items {
		a := &c.Items[i]
		f := d.uv()
		if f >= ackHasError<<1 && (!runs || f >= ackHasCount<<1) {
			return nil, errCorrupt
		}
		a.TxIDKnown = f&ackTxIDKnown != 0
		a.PartitionID = prev.PartitionID
		if f&ackSamePart == 0 {
			a.PartitionID = d.u64()
		}
		if f&ackHasOffset != 0 {
			if f&ackNextOffset != 0 {
				if !hasPrevOff || f&ackSamePart == 0 {
					return nil, errCorrupt
				}
				offs[i] = prevOff + 1
			} else {
				offs[i] = d.uv()
			}
			a.Offset = &offs[i]
		}
		a.Status, a.Group, a.LeaseID = prev.Status, prev.Group, prev.LeaseID
		if f&ackSameStatus == 0 {
			a.Status = str()
		}
		if f&ackSameGroup == 0 {
			a.Group = str()
		}
		if f&ackSameLease == 0 {
			a.LeaseID = str()
		}
		if f&ackHasTxID != 0 {
			a.TxID = str()
		}
		if f&ackHasError != 0 {
			a.Error = str()
		}
		if f&ackHasCount != 0 {
			// A run names its messages by offset only, and ends where
			// offsets do.
			a.Count = d.uv()
			if a.Count < 2 || a.Count > MaxAckRun || a.Offset == nil || a.TxID != "" || *a.Offset+a.Count < *a.Offset {
				return nil, errCorrupt
			}
		}
		if d.err != nil {
			return nil, d.err
		}
		prev = *a
		hasPrevOff = a.Offset != nil
		if hasPrevOff {
			prevOff = offs[i]
			if a.Count > 1 {
				prevOff += a.Count - 1
			}
		}
	}
	return c, d.err
}
