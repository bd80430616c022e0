package cluster

import (
	"encoding/binary"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/queen-mq/queen/internal/stagetime"
)

// The stage-timing hooks (internal/stagetime): called only while a
// benchmark has timing on.

// dataKey names a log entry by its first request id (raft copies an
// entry's data when it appends it, so the leader's log write and its state
// machine see copies of what Propose was given); 0 for entries without one.
func dataKey(b []byte) uintptr {
	if len(b) < 2 || b[0] != envelopeMagic {
		return 0
	}
	n, k := binary.Uvarint(b[1:])
	if k <= 0 || n == 0 || len(b) < 1+k+16 {
		return 0
	}
	id := b[1+k : 1+k+16]
	return uintptr(binary.LittleEndian.Uint64(id[:8]) ^ binary.LittleEndian.Uint64(id[8:]))
}

// stageEntry starts the stamps of an entry holding batch (nil when
// timing is off).
func stageEntry(batch []*proposal) *stagetime.Entry {
	if !stagetime.On() {
		return nil
	}
	traces := make([]*stagetime.Trace, len(batch))
	for i, p := range batch {
		traces[i] = p.trace
	}
	return stagetime.NewEntry(traces)
}

func logRefs(logs []*walRecord) []stagetime.LogRef {
	refs := make([]stagetime.LogRef, len(logs))
	for i, l := range logs {
		refs[i] = stagetime.LogRef{Index: l.Index, Key: dataKey(l.Data)}
	}
	return refs
}

// timedStore is StoreLogs with its start and end recorded.
func (g *guardedLog) timedStore(logs []*walRecord, own bool) error {
	start := stagetime.Now()
	err := g.syncedLog.storeLogs(logs, own)
	end := stagetime.Now()
	leader := g.leader != nil && g.leader()
	stagetime.Stored(leader, g.node, logRefs(logs), start, end)
	return err
}

// stageIndexed registers the leader's entries by index before its own
// write and its followers' start.
func stageIndexed(ents []*pb.Entry) {
	if len(ents) == 0 {
		return
	}
	refs := make([]stagetime.LogRef, len(ents))
	for i, e := range ents {
		refs[i] = stagetime.LogRef{Index: e.GetIndex(), Key: dataKey(e.GetData())}
	}
	stagetime.Indexed(refs)
}

// stageApplied records the state machine's apply of ents.
func stageApplied(ents []*pb.Entry, start stagetime.Stamp) {
	refs := make([]stagetime.LogRef, len(ents))
	for i, e := range ents {
		refs[i] = stagetime.LogRef{Index: e.GetIndex(), Key: dataKey(e.GetData())}
	}
	stagetime.Applied(refs, start, stagetime.Now())
}
