package cluster

import (
	"errors"
	"fmt"
	"time"

	etcdraft "go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/queen-mq/queen/internal/stagetime"
)

// The node's three goroutines around etcd raft (Config.AsyncStorageWrites):
//
//   - the ready loop owns the RawNode: it ticks, steps the peers' messages
//     and the storage threads' answers, takes the commands submitted on this
//     node straight from their callers (everything queued since its last
//     round goes into one entry), read index requests and configuration
//     changes, and hands each Ready's messages on: to the
//     peers at once, log appends to the append thread, committed entries to
//     the apply thread. It never waits for the disk.
//   - the append thread writes entries, the hard state and installed
//     snapshots, fsyncs them as the fsync policy says (fsyncpolicy.go), and
//     only then delivers the answers raft attached (the leader counts its own
//     write, a follower acknowledges the leader). The leader's messages to
//     its followers left with the same Ready, so its write and theirs run at
//     the same time. Under FsyncAlways the leader's append of its own
//     commands (ownAppend) is answered once written, and its fsync runs on
//     the syncer beside the next writes.
//   - the apply thread applies committed entries to the state store in
//     batches and answers the proposers waiting for them by request id. A
//     committed entry waits for no fsync; a reply that promises durability
//     waits, parked without holding the thread, until the leader's log is
//     synced through its entry (replies.go). (On a single-member
//     cluster the ready loop applies commands itself when the apply thread
//     is idle, applyHere, and writes the log when the append thread is
//     idle and the write waits for no fsync, appendHere.)

// applyJob is one piece of work for the apply thread: committed entries
// (msg), or a function run between them (a snapshot install).
type applyJob struct {
	msg  *pb.Message
	fn   func() error
	done chan error
}

// runLoop is the ready loop.
func (n *Node) runLoop() {
	defer close(n.loopDone)
	t := time.NewTicker(n.tick)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			n.rn.Tick()
		case m := <-n.recv:
			n.stepPeer(m)
		case <-n.local.ready():
			n.stepLocal()
		case <-n.propq.ready():
		case f := <-n.funcs:
			f(n.rn)
		case <-n.stopLoop:
			n.dropReads()
			return
		}
		// Take whatever else is waiting before asking for a Ready, so that
		// one Ready (one log append, one apply) carries all of it.
	drain:
		for range 256 {
			select {
			case m := <-n.recv:
				n.stepPeer(m)
			case <-n.local.ready():
				n.stepLocal()
			case f := <-n.funcs:
				f(n.rn)
			default:
				break drain
			}
		}
		n.proposeQueued()
		if n.rn.HasReady() {
			n.handleReady(n.rn.Ready())
		}
	}
}

func (n *Node) stepLocal() {
	msgs := n.local.take()
	for _, m := range msgs {
		if err := n.rn.Step(m); err != nil {
			n.log.Debug("raft refused a storage answer", "type", m.GetType().String(), "err", err)
		}
	}
	n.local.recycle(msgs)
}

func (n *Node) stepPeer(m *pb.Message) {
	if err := n.rn.Step(m); err != nil && !errors.Is(err, etcdraft.ErrStepPeerNotFound) {
		n.log.Debug("raft refused a message", "type", m.GetType().String(), "from", m.GetFrom(), "err", err)
	}
}

func (n *Node) handleReady(rd etcdraft.Ready) {
	if ss := rd.SoftState; ss != nil {
		n.softState(ss)
	}
	if hs := rd.HardState; hs != nil {
		n.term.Store(hs.GetTerm())
		n.commit.Store(hs.GetCommit())
	}
	for _, rs := range rd.ReadStates {
		if ch, ok := n.reads[string(rs.RequestCtx)]; ok {
			delete(n.reads, string(rs.RequestCtx))
			ch <- rs.Index
			close(ch)
		}
	}
	for _, m := range rd.Messages {
		switch m.GetTo() {
		case etcdraft.LocalAppendThread:
			if stagetime.On() && n.rstate.Load() == int32(etcdraft.StateLeader) {
				stageIndexed(m.GetEntries())
			}
			if n.appendHere(m) {
				continue
			}
			n.appendQueued.Add(1)
			n.appendq.put(m)
		case etcdraft.LocalApplyThread:
			if n.applyHere(m) {
				continue
			}
			n.applyQueued.Add(1)
			n.applyq.put(applyJob{msg: m})
		default:
			n.tr.send(m)
		}
	}
	n.releaseReplicated()
}

// softState follows leadership: a new leader serves once it has applied an
// entry of its own term (the empty entry raft appends when it takes
// office, after every entry of earlier terms); a leader that loses office
// fails its proposals in flight as "may have been applied".
func (n *Node) softState(ss *etcdraft.SoftState) {
	prev := etcdraft.StateType(n.rstate.Load())
	n.rstate.Store(int32(ss.RaftState))
	n.leadID.Store(ss.Lead)
	if ss.RaftState == etcdraft.StateLeader && prev != etcdraft.StateLeader {
		n.leaderTerm.Store(n.rn.BasicStatus().GetTerm())
	}
	if prev == etcdraft.StateLeader && ss.RaftState != etcdraft.StateLeader {
		n.ready.Store(false)
		n.leaderTerm.Store(0)
		n.dropReads()
		n.failProposed(errors.New("leadership lost while the entry was in flight"))
		n.log.Info("no longer leading", "state", stateName(ss.RaftState))
	}
	n.notifyApplied()
}

func (n *Node) dropReads() {
	for k, ch := range n.reads {
		delete(n.reads, k)
		close(ch)
	}
}

// failProposed fails every proposal of this node that raft took (it may
// still be committed by the next leader: the retry goes with its ids).
func (n *Node) failProposed(err error) {
	var failed []*proposal
	n.dedup.mu.Lock()
	for id, p := range n.dedup.pending {
		if p.proposed.Load() {
			delete(n.dedup.pending, id)
			failed = append(failed, p)
		}
	}
	n.dedup.mu.Unlock()
	for _, p := range failed {
		p.finish(result{err: fmt.Errorf("%w: %v", ErrNotLeader, err), oc: outMaybe})
	}
}

// runAppend is the append thread.
func (n *Node) runAppend() { n.appendTurn() }

// appendTurn runs the append thread until it stops, or until it hands the
// thread on to a new turn to run a sync round itself (syncturn.go).
func (n *Node) appendTurn() {
	for {
		select {
		case <-n.appendq.ready():
		case <-n.stopStorage:
			close(n.appendDone)
			return
		}
		n.appender.Lock()
		msgs := n.appendq.take()
		n.appendTaken.Add(uint64(len(msgs)))
		ok := n.storeRuns(msgs)
		n.appendQueued.Add(-int64(len(msgs)))
		n.appender.Unlock()
		n.appendq.recycle(msgs)
		if !ok {
			<-n.stopStorage
			close(n.appendDone)
			return
		}
		if n.fsync.uncovered() {
			if n.fsync.takeIdle() {
				go n.appendTurn()
				n.syncOwn()
				return
			}
			n.fsync.demandOwn()
		}
	}
}

// storeRuns stores the append thread's messages in order (n.appender
// held); false: the node cannot write its log and stopped.
func (n *Node) storeRuns(msgs []*pb.Message) bool {
	for i := 0; i < len(msgs); {
		// Contiguous appends without a snapshot between them are written
		// (and synced) as one.
		j := i + 1
		for j < len(msgs) && canMerge(msgs[j-1], msgs[j]) {
			j++
		}
		if !n.storeAppends(msgs[i:j]) {
			return false
		}
		i = j
	}
	return true
}

// appendHere writes the leader's append on the ready loop itself when
// nothing can wait for it meanwhile: under FsyncInterval, or under
// FsyncAlways for the leader's own commands (ownAppend) (the write goes
// to the OS; no fsync is waited for) and for appends that write nothing
// (bareAppend: the one after each commit), on the configuration's only member
// (no followers' messages wait for the loop), with no snapshot in it, and
// when the append thread has nothing queued and is not writing (appends
// stay in order). A write then waits for no hand-over to the append
// thread and back; its answer is stepped on the loop's next round. false:
// the append thread takes it.
func (n *Node) appendHere(m *pb.Message) bool {
	if !n.soleVoter.Load() || n.rstate.Load() != int32(etcdraft.StateLeader) ||
		n.appendQueued.Load() != 0 || !etcdraft.IsEmptySnap(m.GetSnapshot()) {
		return false
	}
	if n.fsync.mode != FsyncInterval && !n.ownAppend([]*pb.Message{m}) && !n.bareAppend(m) {
		return false
	}
	if !n.appender.TryLock() {
		return false
	}
	defer n.appender.Unlock()
	if n.appendQueued.Load() != 0 {
		return false
	}
	if n.HaltError() == nil {
		// After a failed write nothing more is written (as on the append
		// thread): the node stopped.
		if n.storeAppends([]*pb.Message{m}) {
			// The loop must not wait for the disk: a worker runs the
			// round of what it wrote.
			n.fsync.demandOwn()
		}
	}
	return true
}

// bareAppend reports whether an append writes nothing: no entries, no
// snapshot, no change of the term or vote (a commit index alone is not
// written, logStore.setHardState), and every answer goes to this node
// itself. The leader emits one after each commit; under FsyncAlways it
// then needs no fsync, only its answers delivered after those of the
// appends before it.
func (n *Node) bareAppend(m *pb.Message) bool {
	return len(m.GetEntries()) == 0 && n.selfOnly(m)
}

// selfOnly reports whether an append carries no snapshot, changes neither
// the term nor the vote, and answers only this node itself.
func (n *Node) selfOnly(m *pb.Message) bool {
	if !etcdraft.IsEmptySnap(m.GetSnapshot()) {
		return false
	}
	if (m.Vote != nil || m.Term != nil) && n.logs.hardStateChanges(m.GetTerm(), m.GetVote()) {
		return false
	}
	for _, r := range m.GetResponses() {
		if r.GetTo() != n.rid {
			return false
		}
	}
	return true
}

func canMerge(a, b *pb.Message) bool {
	if b.GetSnapshot() != nil && !etcdraft.IsEmptySnap(b.GetSnapshot()) {
		return false
	}
	ae, be := a.GetEntries(), b.GetEntries()
	if len(ae) == 0 || len(be) == 0 {
		return true
	}
	return be[0].GetIndex() == ae[len(ae)-1].GetIndex()+1
}

// ownAppend reports whether a run of appends holds only this leader's own
// commands, whose fsync the answers raft attached need not wait for
// (FsyncAlways): this node leads, every entry is a normal entry with data
// of the term it leads (so it proposed it; raft's empty entry of a new
// term and configuration changes are synced as before), no snapshot, no
// change of the term or vote, and every answer goes to this node itself
// (it counts its own write; no other node is told anything). A commit
// then means the leader has the entry written and every follower that
// counted has it on disk; the replies wait for the leader's fsync
// (replies.go).
func (n *Node) ownAppend(msgs []*pb.Message) bool {
	if n.fsync.mode != FsyncAlways || n.rstate.Load() != int32(etcdraft.StateLeader) {
		return false
	}
	term := n.leaderTerm.Load()
	if term == 0 {
		return false
	}
	ents := 0
	for _, m := range msgs {
		if !n.selfOnly(m) {
			return false
		}
		for _, e := range m.GetEntries() {
			if e.GetType() != pb.EntryNormal || len(e.GetData()) == 0 || e.GetTerm() != term {
				return false
			}
			ents++
		}
	}
	return ents > 0
}

// storeAppends makes a run of MsgStorageAppend durable (or, for the
// leader's own commands, written: ownAppend), then delivers their answers.
// false: the node cannot write its log and stopped.
func (n *Node) storeAppends(msgs []*pb.Message) bool {
	if snap := msgs[0].GetSnapshot(); snap != nil && !etcdraft.IsEmptySnap(snap) {
		if err := n.installSnapshot(snap); err != nil {
			n.halt(fmt.Errorf("install the leader's snapshot at index %d: %w", snap.GetMetadata().GetIndex(), err))
			return false
		}
	}
	own := n.ownAppend(msgs)
	var ents []*pb.Entry
	var hs *pb.HardState
	for _, m := range msgs {
		ents = append(ents, m.GetEntries()...)
		if m.Vote != nil || m.Term != nil {
			hs = &pb.HardState{Term: new(m.GetTerm()), Vote: new(m.GetVote()), Commit: new(m.GetCommit())}
		}
	}
	for {
		err := n.logs.append(ents, own)
		if err == nil {
			break
		}
		var e *Error
		if errors.As(err, &e) && e.Code == "insufficient_storage" {
			// A follower on a full disk takes nothing more until space is
			// freed; its leader commits with the others meanwhile.
			select {
			case <-n.stopStorage:
				return false
			case <-time.After(diskCheckEvery):
			}
			continue
		}
		n.halt(fmt.Errorf("write the raft log: %w", err))
		return false
	}
	if hs != nil {
		if err := n.logs.setHardState(hs); err != nil {
			n.halt(err)
			return false
		}
	}
	if !own && n.fsync.owes() && tellsOthers(msgs, n.rid) {
		// This node wrote appends of its own as leader without their
		// fsync, and now tells another node about its log (an ex-leader
		// acknowledging a new leader, a vote): they reach the disk first.
		if err := n.fsync.syncRound(); err != nil {
			n.halt(fmt.Errorf("sync the raft log: %w", err))
			return false
		}
	}
	for _, m := range msgs {
		for _, r := range m.GetResponses() {
			if r.GetTo() == n.rid {
				n.local.put(r)
			} else {
				n.tr.send(r)
			}
		}
	}
	return true
}

// tellsOthers reports whether any answer of msgs goes to another node.
func tellsOthers(msgs []*pb.Message, self uint64) bool {
	for _, m := range msgs {
		for _, r := range m.GetResponses() {
			if r.GetTo() != self {
				return true
			}
		}
	}
	return false
}

// runApply is the apply thread.
func (n *Node) runApply() {
	defer close(n.applyDone)
	var snapTick <-chan time.Time
	if n.cfg.SnapshotInterval > 0 {
		t := time.NewTicker(n.cfg.SnapshotInterval)
		defer t.Stop()
		snapTick = t.C
	}
	for {
		select {
		case <-n.applyq.ready():
		case <-snapTick:
			n.snapshotTick()
			continue
		case <-n.snapKick:
			n.applier.Lock()
			_, err := n.takeSnapshot()
			n.applier.Unlock()
			if err != nil {
				n.log.Warn("taking a snapshot for a follower failed; trying again when raft asks", "err", err)
			}
			continue
		case <-n.stopStorage:
			return
		}
		n.applier.Lock()
		jobs := n.applyq.take()
		if !n.applyJobs(jobs) {
			n.applier.Unlock()
			<-n.stopStorage
			return
		}
		n.applyQueued.Add(-int64(len(jobs)))
		n.applier.Unlock()
		n.applyq.recycle(jobs)
	}
}

// applyJobs runs the apply thread's jobs in order (n.applier held); false
// when the store cannot apply.
func (n *Node) applyJobs(jobs []applyJob) bool {
	for i := 0; i < len(jobs); {
		if jobs[i].fn != nil {
			jobs[i].done <- jobs[i].fn()
			i++
			continue
		}
		j := i
		var ents []*pb.Entry
		for j < len(jobs) && jobs[j].fn == nil {
			ents = append(ents, jobs[j].msg.GetEntries()...)
			j++
		}
		if !n.applyEntries(ents) {
			return false
		}
		for _, job := range jobs[i:j] {
			for _, r := range job.msg.GetResponses() {
				n.local.put(r)
			}
		}
		i = j
	}
	return true
}

// applyHere applies committed entries on the ready loop itself, sparing
// the hand-over to the apply thread and back that each write otherwise
// waits for after its log write. Only on the configuration's only member
// (no followers wait for the loop meanwhile), for commands only (a
// configuration change is applied through the apply thread), and when the
// apply thread has nothing queued and is not busy (entries stay in order,
// and no snapshot is taken meanwhile). Under FsyncAlways the fsync stays on
// the append thread, so the loop never waits for the disk; under
// FsyncInterval the loop also writes the log (appendHere), and a write is
// then answered without leaving the loop. While the loop applies, new
// commands queue and share the next entry. false: the apply thread takes
// them.
func (n *Node) applyHere(m *pb.Message) bool {
	if !n.soleVoter.Load() || n.cfg.SnapshotInterval <= 0 || n.applyQueued.Load() != 0 || !plainCommands(m.GetEntries()) {
		return false
	}
	if !n.applier.TryLock() {
		return false
	}
	defer n.applier.Unlock()
	if n.applyQueued.Load() != 0 {
		return false
	}
	if !n.applyEntries(m.GetEntries()) {
		return true // the node stopped; nothing is applied after this
	}
	for _, r := range m.GetResponses() {
		n.local.put(r)
	}
	return true
}

// plainCommands reports whether ents are commands only (not empty, and no
// configuration change).
func plainCommands(ents []*pb.Entry) bool {
	for _, e := range ents {
		if e.GetType() != pb.EntryNormal || len(e.GetData()) == 0 {
			return false
		}
	}
	return len(ents) > 0
}

// applyEntries applies committed entries; false when the store cannot.
func (n *Node) applyEntries(ents []*pb.Entry) bool {
	if len(ents) == 0 {
		return true
	}
	if n.HaltError() != nil {
		return false
	}
	for _, e := range ents {
		if t := e.GetType(); t == pb.EntryConfChange || t == pb.EntryConfChangeV2 {
			if err := n.applyConf(e); err != nil {
				n.halt(fmt.Errorf("apply the configuration change at index %d: %w", e.GetIndex(), err))
				return false
			}
		}
	}
	ids, res, ok := n.fsm.applyBatch(ents)
	if !ok {
		return false
	}
	n.raftApplied.Store(ents[len(ents)-1].GetIndex())
	n.logs.releaseApplied(ents[len(ents)-1].GetIndex())
	n.answer(ents, ids, res)
	last := ents[len(ents)-1]
	if !n.ready.Load() && last.GetTerm() == n.leaderTerm.Load() && n.rstate.Load() == int32(etcdraft.StateLeader) {
		n.ready.Store(true)
		n.log.Info("leading", "term", last.GetTerm())
		n.notifyApplied()
	}
	if n.cfg.SnapshotInterval <= 0 {
		n.maybeSnapshot()
	}
	return true
}

// answer hands the proposers waiting on this node their results: at once,
// or once the log is on disk through their entry (needsSync, replies.go).
func (n *Node) answer(ents []*pb.Entry, ids [][]reqID, res []any) {
	var done []durableReply
	n.dedup.mu.Lock()
	for i := range ids {
		rs, _ := res[i].([]any)
		if rs == nil {
			continue
		}
		for j, id := range ids[i] {
			p := n.dedup.pending[id]
			if p == nil {
				continue
			}
			delete(n.dedup.pending, id)
			r := durableReply{p: p}
			if n.needsSync(p.cmd) {
				r.index = ents[i].GetIndex()
			}
			if j < len(rs) {
				r.r.val = rs[j]
			}
			done = append(done, r)
		}
	}
	n.dedup.mu.Unlock()
	n.replies.add(done)
}

// installSnapshot puts a snapshot received from the leader in place: the
// apply thread, once it has applied everything before it, swaps the state;
// then the log restarts after the snapshot and the membership is its.
func (n *Node) installSnapshot(snap *pb.Snapshot) error {
	sd, err := decodeSnapData(snap.GetData())
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	n.applyQueued.Add(1)
	n.applyq.put(applyJob{fn: func() error {
		_, rc, err := n.fsm.snaps.Open(sd.ID)
		if err != nil {
			return err
		}
		return n.fsm.Restore(rc)
	}, done: done})
	select {
	case err := <-done:
		if err != nil {
			return err
		}
	case <-n.stopStorage:
		return ErrShutdown
	}
	n.logTrim.Lock()
	err = n.logs.installSnapshot(snap)
	n.logTrim.Unlock()
	if err != nil {
		return err
	}
	n.raftApplied.Store(snap.GetMetadata().GetIndex())
	conf := confRecord{Index: snap.GetMetadata().GetIndex(), Members: sd.Members}
	conf.Conf, _ = marshalConfState(snap.GetMetadata().GetConfState())
	if err := n.logs.setConf(conf); err != nil {
		return err
	}
	n.setMembers(conf)
	return nil
}
