package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"

	raftwal "github.com/hashicorp/raft-wal"
	etcdraft "go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"
)

// logStore is etcd raft's Storage over the raft-wal log: entries are
// raft-wal records (raft-wal's record type is hashicorp's raft.Log; only
// the type is used), and the hard state and the membership are keys of
// raft-wal's metadata store, written durably when they change.
//
// The log's first entry may follow a compacted prefix: base is the index
// before the first entry (the snapshot's, or a compaction point), and its
// term is kept when known. Every entry's term is held in memory (8 bytes
// an entry) and the newest entries whole, so that raft's reads of the tail
// (committed entries for the apply thread, appends for followers that keep
// up) do not go to the disk. An entry leaves the tail once the apply thread
// has it and every replicating follower holds it (release): nothing reads
// it from memory after that, and a follower that falls behind reads the
// log file.
type logStore struct {
	wal  *raftwal.WAL
	log  *guardedLog // appends and truncations, with the fsync policy
	mu   sync.RWMutex
	base uint64
	// baseTerm is the term at base when known (baseKnown).
	baseTerm  uint64
	baseKnown bool
	last      uint64
	terms     []uint64 // terms[i] is the term of index base+1+i
	// ends[i] counts the entries' data bytes through index base+1+i, and
	// baseEnd through base, from an origin of no meaning (differences
	// between two are the log's bytes between two indexes).
	ends     []uint64
	baseEnd  uint64
	recent   []*pb.Entry // the newest entries, through last
	recentSz int         // their data's bytes
	// applied and replicated: entries through both may leave recent
	// (release).
	applied    atomic.Uint64
	replicated atomic.Uint64
	snap       *pb.Snapshot
	hs         *pb.HardState // as persisted
	conf       confRecord    // as persisted
	// stale is told when raft asks for a snapshot to send and the newest
	// one predates the membership: it has the apply thread take another.
	stale func()
	// onApplied is told each index through which the apply thread has the
	// entries, after releaseApplied (nil: nothing).
	onApplied func(index uint64)
}

// Keys of raft-wal's metadata store.
var (
	keyFormat    = []byte("queen-raft-format")
	keyHardState = []byte("queen-hardstate")
	keyConf      = []byte("queen-conf")
	// hashicorp/raft's keys: a data directory holding them was written by
	// an earlier version.
	keyOldTerm = []byte("CurrentTerm")
)

const raftFormat = "etcd-raft-v3"

// recentEntries and recentBytes bound the newest entries kept in memory:
// enough for the apply thread and for followers that keep up, which read
// them right after they are written; a follower further behind reads the
// log file. The bytes count against the node's memory budget
// (QUEEN_MEMORY_LIMIT), so they stay small.
const (
	recentEntries = 4096
	recentBytes   = 8 << 20
)

// member is a server of the configuration: its node id and raft address.
type member struct {
	ID   string `json:"id"`
	Addr string `json:"address"`
}

// confRecord is the membership as of a log index: raft's ConfState and the
// ids and addresses of its members.
type confRecord struct {
	Index   uint64            `json:"index"`
	Conf    []byte            `json:"conf,omitempty"` // a marshalled pb.ConfState
	Members map[uint64]member `json:"members,omitempty"`
}

func (c *confRecord) confState() *pb.ConfState {
	cs := &pb.ConfState{}
	if len(c.Conf) > 0 {
		_ = proto.Unmarshal(c.Conf, cs)
	}
	return cs
}

// ErrOldDataDir refuses a data directory written by a version of queen
// that used hashicorp/raft's log format.
var ErrOldDataDir = errors.New("the data directory was written by an earlier version of queen, whose raft log this version cannot read")

// openLogStore reads the log's state. snap is the newest snapshot (nil
// when there is none); a log behind it (an install cut short before the
// log was reset) is reset to it here.
func openLogStore(wal *raftwal.WAL, gl *guardedLog, snap *pb.Snapshot, conf *confRecord, dataDir string) (*logStore, bool, error) {
	s := &logStore{wal: wal, log: gl, snap: snap}
	format, _ := wal.Get(keyFormat)
	first, err := wal.FirstIndex()
	if err != nil {
		return nil, false, err
	}
	last, err := wal.LastIndex()
	if err != nil {
		return nil, false, err
	}
	old, _ := wal.Get(keyOldTerm)
	if string(format) != raftFormat {
		if len(format) > 0 || len(old) > 0 || last > 0 {
			return nil, false, fmt.Errorf("%w (%s): move the directory away and start the node with an empty one; the nodes of a cluster start a new cluster together, since old and new versions cannot be mixed (docs/operations.md, \"Upgrading from a hashicorp/raft data directory\")", ErrOldDataDir, dataDir)
		}
		if err := wal.Set(keyFormat, []byte(raftFormat)); err != nil {
			return nil, false, fmt.Errorf("mark the raft log's format: %w", err)
		}
	}
	if b, _ := wal.Get(keyHardState); len(b) > 0 {
		hs := &pb.HardState{}
		if err := proto.Unmarshal(b, hs); err != nil {
			return nil, false, fmt.Errorf("decode the raft hard state: %w", err)
		}
		s.hs = hs
	}
	if b, _ := wal.Get(keyConf); len(b) > 0 {
		if err := json.Unmarshal(b, &s.conf); err != nil {
			return nil, false, fmt.Errorf("decode the raft membership: %w", err)
		}
	}
	if conf != nil && conf.Index > s.conf.Index {
		s.conf = *conf
	}
	has := s.hs != nil || last > 0 || snap != nil
	if last == 0 {
		first = 0
	}
	if snap != nil {
		si := snap.GetMetadata().GetIndex()
		if last < si || first > si+1 {
			// The log does not reach the snapshot: it starts from it.
			if last > 0 {
				if err := wal.DeleteRange(first, last); err != nil {
					return nil, false, fmt.Errorf("reset the raft log to snapshot %d: %w", si, err)
				}
			}
			first, last = 0, 0
		}
	}
	switch {
	case last == 0 && snap != nil:
		s.base, s.baseTerm, s.baseKnown, s.last = snap.GetMetadata().GetIndex(), snap.GetMetadata().GetTerm(), true, snap.GetMetadata().GetIndex()
	case last == 0:
		s.base, s.baseKnown = 0, true
	default:
		s.base, s.last = first-1, last
		if snap != nil && snap.GetMetadata().GetIndex() == s.base {
			s.baseTerm, s.baseKnown = snap.GetMetadata().GetTerm(), true
		} else if s.base == 0 {
			s.baseKnown = true
		}
		s.terms = make([]uint64, 0, last-first+1)
		s.ends = make([]uint64, 0, last-first+1)
		var l walRecord
		end := uint64(0)
		for i := first; i <= last; i++ {
			if err := wal.GetLog(i, &l); err != nil {
				return nil, false, fmt.Errorf("read raft log entry %d: %w", i, err)
			}
			s.terms = append(s.terms, l.Term)
			end += uint64(len(l.Data))
			s.ends = append(s.ends, end)
			if last-i < recentEntries {
				s.recent = append(s.recent, fromLog(&l))
				s.recentSz += len(l.Data)
			}
		}
		s.trimRecent()
	}
	return s, has, nil
}

// toLog is an entry as a raft-wal record: its type goes in Extensions
// unless it is a normal entry.
func toLog(e *pb.Entry) *walRecord {
	l := &walRecord{Index: e.GetIndex(), Term: e.GetTerm(), Type: walCommand, Data: e.GetData()}
	if t := e.GetType(); t != pb.EntryNormal {
		l.Extensions = []byte{byte(t)}
	}
	return l
}

func fromLog(l *walRecord) *pb.Entry {
	t := pb.EntryNormal
	if len(l.Extensions) == 1 {
		t = pb.EntryType(l.Extensions[0])
	}
	return &pb.Entry{Index: new(l.Index), Term: new(l.Term), Type: t.Enum(), Data: l.Data}
}

// InitialState implements etcdraft.Storage.
func (s *logStore) InitialState() (*pb.HardState, *pb.ConfState, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var hs *pb.HardState
	if s.hs != nil {
		hs = proto.Clone(s.hs).(*pb.HardState)
	}
	return hs, s.conf.confState(), nil
}

// Entries implements etcdraft.Storage.
func (s *logStore) Entries(lo, hi, maxSize uint64) ([]*pb.Entry, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if lo <= s.base {
		return nil, etcdraft.ErrCompacted
	}
	if hi > s.last+1 {
		return nil, etcdraft.ErrUnavailable
	}
	var out []*pb.Entry
	size := uint64(0)
	recentFirst := s.last + 1 - uint64(len(s.recent))
	var l walRecord
	for i := lo; i < hi; i++ {
		var e *pb.Entry
		if i >= recentFirst {
			e = s.recent[i-recentFirst]
		} else {
			if err := s.wal.GetLog(i, &l); err != nil {
				return nil, fmt.Errorf("read raft log entry %d: %w", i, err)
			}
			e = fromLog(&l)
		}
		size += uint64(proto.Size(e))
		if len(out) > 0 && size > maxSize {
			break
		}
		out = append(out, e)
	}
	return out, nil
}

// Term implements etcdraft.Storage.
func (s *logStore) Term(i uint64) (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	switch {
	case i == s.base:
		if !s.baseKnown {
			return 0, etcdraft.ErrCompacted
		}
		return s.baseTerm, nil
	case i < s.base:
		return 0, etcdraft.ErrCompacted
	case i > s.last:
		return 0, etcdraft.ErrUnavailable
	}
	return s.terms[i-s.base-1], nil
}

// LastIndex implements etcdraft.Storage.
func (s *logStore) LastIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.last, nil
}

// FirstIndex implements etcdraft.Storage.
func (s *logStore) FirstIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.base + 1, nil
}

// Snapshot implements etcdraft.Storage.
func (s *logStore) Snapshot() (*pb.Snapshot, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.snap == nil || s.snap.GetMetadata().GetIndex() < s.conf.Index {
		// A follower added since the newest snapshot is not in its
		// membership and would refuse it.
		if s.stale != nil {
			s.stale()
		}
		return nil, etcdraft.ErrSnapshotTemporarilyUnavailable
	}
	return s.snap, nil
}

func (s *logStore) lastIndex() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.last
}

func (s *logStore) snapshotIndex() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.snap.GetMetadata().GetIndex()
}

// append writes entries, cutting the log's tail first where they replace
// it (a follower taking a new leader's entries); own: they are the
// leader's own commands, written without waiting for their fsync
// (Node.ownAppend).
func (s *logStore) append(ents []*pb.Entry, own bool) error {
	if len(ents) == 0 {
		return nil
	}
	from := ents[0].GetIndex()
	s.mu.RLock()
	base, last := s.base, s.last
	s.mu.RUnlock()
	if from <= base {
		return fmt.Errorf("append at index %d, at or before the log's start %d", from, base+1)
	}
	if from > last+1 {
		return fmt.Errorf("append at index %d leaves a gap after the log's last index %d", from, last)
	}
	if from <= last {
		if err := s.log.DeleteRange(from, last); err != nil {
			return fmt.Errorf("cut the raft log from index %d: %w", from, err)
		}
		s.mu.Lock()
		s.terms = s.terms[:from-s.base-1]
		s.ends = s.ends[:from-s.base-1]
		recentFirst := s.last + 1 - uint64(len(s.recent))
		if from > recentFirst {
			s.recent = s.recent[:from-recentFirst]
		} else {
			s.recent = nil
		}
		s.recentSz = 0
		for _, e := range s.recent {
			s.recentSz += len(e.GetData())
		}
		s.last = from - 1
		s.mu.Unlock()
	}
	logs := make([]*walRecord, len(ents))
	for i, e := range ents {
		logs[i] = toLog(e)
	}
	if err := s.log.storeLogs(logs, own); err != nil {
		return err
	}
	s.mu.Lock()
	end := s.endAt(s.last)
	for _, e := range ents {
		s.terms = append(s.terms, e.GetTerm())
		end += uint64(len(e.GetData()))
		s.ends = append(s.ends, end)
	}
	s.recent = append(s.recent, ents...)
	for _, e := range ents {
		s.recentSz += len(e.GetData())
	}
	s.trimRecent()
	s.last = ents[len(ents)-1].GetIndex()
	s.mu.Unlock()
	return nil
}

// releaseApplied drops from the in-memory tail the entries through index,
// which the apply thread has, unless a follower may still need them.
func (s *logStore) releaseApplied(index uint64) {
	if s.applied.Load() >= index {
		return
	}
	s.mu.Lock()
	if index > s.applied.Load() {
		s.applied.Store(index)
	}
	s.trimRecent()
	s.mu.Unlock()
	if s.onApplied != nil {
		s.onApplied(index)
	}
}

// endAt is ends at index i, clamped to the log (s.mu held).
func (s *logStore) endAt(i uint64) uint64 {
	switch {
	case i <= s.base || len(s.ends) == 0:
		return s.baseEnd
	case i > s.last:
		return s.ends[len(s.ends)-1]
	}
	return s.ends[i-s.base-1]
}

// bytesBetween is the entries' data bytes in the log after index from and
// through index through (the part of that range still in the log).
func (s *logStore) bytesBetween(from, through uint64) uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if through <= from {
		return 0
	}
	return s.endAt(through) - s.endAt(from)
}

// compactPoint is the index through which the log may be dropped so that
// it keeps, before index upTo and with it, at most entries entries and at
// most maxBytes of their data (0 when nothing is to be dropped).
func (s *logStore) compactPoint(upTo, entries, maxBytes uint64) uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	upTo = min(upTo, s.last)
	lo := s.base
	if upTo > entries {
		lo = max(lo, upTo-entries)
	}
	if upTo <= lo {
		return 0
	}
	// The first index j at or after lo whose bytes through upTo fit.
	top := s.endAt(upTo)
	k := sort.Search(int(upTo-lo), func(k int) bool {
		return top-s.endAt(lo+uint64(k)) <= maxBytes
	})
	if j := lo + uint64(k); j > s.base {
		return j
	}
	return 0
}

// releaseReplicated drops from the in-memory tail the entries through
// index, which every follower that replicates holds, once they are applied
// (math.MaxUint64 when there is no follower to send to).
func (s *logStore) releaseReplicated(index uint64) {
	if s.replicated.Swap(index) == index {
		return
	}
	s.mu.Lock()
	s.trimRecent()
	s.mu.Unlock()
}

// releaseReplicated tells the log's in-memory tail which entries every
// follower in the replicating state holds (on the ready loop, which owns
// the RawNode). A follower that probes or takes a snapshot reads the log
// file when it replicates again; one that is not leading sends to none.
func (n *Node) releaseReplicated() {
	through := uint64(math.MaxUint64)
	if n.rstate.Load() == int32(etcdraft.StateLeader) {
		n.rn.WithProgress(func(id uint64, _ etcdraft.ProgressType, pr tracker.Progress) {
			if id != n.rid && pr.State == tracker.StateReplicate {
				through = min(through, pr.Match)
			}
		})
	}
	n.logs.releaseReplicated(through)
}

// trimRecent keeps the newest entries within their bounds, and drops the
// ones released (s.mu held).
func (s *logStore) trimRecent() {
	done := min(s.applied.Load(), s.replicated.Load())
	drop := 0
	for drop < len(s.recent) && s.recent[drop].GetIndex() <= done {
		s.recentSz -= len(s.recent[drop].GetData())
		s.recent[drop] = nil
		drop++
	}
	for len(s.recent)-drop > 1 && (len(s.recent)-drop > recentEntries || s.recentSz > recentBytes) {
		s.recentSz -= len(s.recent[drop].GetData())
		s.recent[drop] = nil // the backing array outlives the slice
		drop++
	}
	// Resliced, not copied: append moves the live part to a new array
	// once the old one is full.
	s.recent = s.recent[drop:]
}

// hardStateChanges reports whether a hard state with this term and vote
// would be written (setHardState).
func (s *logStore) hardStateChanges(term, vote uint64) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.hs == nil || s.hs.GetTerm() != term || s.hs.GetVote() != vote
}

// setHardState persists the hard state when its term or vote changed (a
// commit index alone is not written: at start the state's applied index
// stands in for it).
func (s *logStore) setHardState(hs *pb.HardState) error {
	s.mu.RLock()
	same := s.hs != nil && s.hs.GetTerm() == hs.GetTerm() && s.hs.GetVote() == hs.GetVote()
	s.mu.RUnlock()
	if same {
		return nil
	}
	b, err := proto.Marshal(hs)
	if err != nil {
		return err
	}
	if err := s.wal.Set(keyHardState, b); err != nil {
		return fmt.Errorf("persist the raft term and vote: %w", err)
	}
	s.mu.Lock()
	s.hs = proto.Clone(hs).(*pb.HardState)
	s.mu.Unlock()
	return nil
}

// setConf persists the membership.
func (s *logStore) setConf(c confRecord) error {
	b, err := json.Marshal(&c)
	if err != nil {
		return err
	}
	if err := s.wal.Set(keyConf, b); err != nil {
		return fmt.Errorf("persist the raft membership: %w", err)
	}
	s.mu.Lock()
	s.conf = c
	s.mu.Unlock()
	return nil
}

func (s *logStore) confRecord() confRecord {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.conf
}

// setSnapshot records a new snapshot (taken here) for raft to send.
func (s *logStore) setSnapshot(snap *pb.Snapshot) {
	s.mu.Lock()
	if s.snap == nil || snap.GetMetadata().GetIndex() > s.snap.GetMetadata().GetIndex() {
		s.snap = snap
	}
	s.mu.Unlock()
}

// installSnapshot resets the log to a snapshot received from the leader:
// every entry goes, and the log continues after the snapshot's index.
func (s *logStore) installSnapshot(snap *pb.Snapshot) error {
	s.mu.RLock()
	base, last := s.base, s.last
	s.mu.RUnlock()
	if last > base {
		if err := s.log.DeleteRange(base+1, last); err != nil {
			return fmt.Errorf("reset the raft log to the snapshot: %w", err)
		}
	}
	md := snap.GetMetadata()
	s.mu.Lock()
	s.snap = snap
	s.base, s.baseTerm, s.baseKnown, s.last = md.GetIndex(), md.GetTerm(), true, md.GetIndex()
	s.terms, s.recent, s.recentSz = nil, nil, 0
	s.ends, s.baseEnd = nil, 0
	s.mu.Unlock()
	s.log.s.truncatedTail(base + 1)
	s.log.s.advanceSynced(md.GetIndex())
	return nil
}

// compact drops the entries through index (kept: the term at index). The
// log's start moves first, and raft-wal drops the entries after: a read
// of them (raft on the ready loop, catching a follower up) then gets
// etcdraft.ErrCompacted and sends a snapshot. Deleted first, a read that
// found them still in the log failed to find them in raft-wal, and raft
// panics on any other error of its Storage.
func (s *logStore) compact(index uint64) error {
	s.mu.Lock()
	base, last := s.base, s.last
	if index <= base || index > last {
		s.mu.Unlock()
		return nil
	}
	s.baseTerm, s.baseKnown = s.terms[index-base-1], true
	s.baseEnd = s.ends[index-base-1]
	s.terms = append([]uint64(nil), s.terms[index-base:]...)
	s.ends = append([]uint64(nil), s.ends[index-base:]...)
	s.base = index
	s.mu.Unlock()
	// From raft-wal's own start: a compaction whose delete failed left it
	// before base+1, and raft-wal cuts only a prefix or a suffix.
	from := base + 1
	if first, err := s.wal.FirstIndex(); err == nil && first > 0 && first < from {
		from = first
	}
	if err := s.log.DeleteRange(from, index); err != nil {
		return fmt.Errorf("compact the raft log through %d: %w", index, err)
	}
	return nil
}
