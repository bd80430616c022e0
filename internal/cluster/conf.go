package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"sort"
	"time"

	etcdraft "go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// The membership: raft knows members by uint64 ids; every configuration
// change carries the member's node id and raft address in its context, and
// each node keeps the table (with raft's ConfState) durably as of the last
// change it applied (logStore.setConf) and in every snapshot.

// raftID is the raft id of a node id.
func raftID(id string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	v := h.Sum64() >> 1 // never one of raft's local thread ids
	if v == 0 {
		v = 1
	}
	return v
}

// confCtx is the context of a configuration change this package proposes.
type confCtx struct {
	Token string `json:"token,omitempty"` // names the waiting proposer
	ID    string `json:"id"`
	Addr  string `json:"address"`
}

func marshalConfState(cs *pb.ConfState) ([]byte, error) {
	if cs == nil {
		return nil, nil
	}
	return proto.Marshal(cs)
}

// server is a member of the configuration as status pages show it.
type server struct {
	ID       string
	Address  string
	Suffrage string // Voter, Nonvoter
	rid      uint64
}

func (n *Node) setMembers(c confRecord) {
	c.Members = maps.Clone(c.Members)
	n.members.Store(&c)
	cs := c.confState()
	n.soleVoter.Store(len(cs.GetVoters()) == 1 && cs.GetVoters()[0] == n.rid && len(cs.GetVotersOutgoing()) == 0 &&
		len(cs.GetLearners()) == 0 && len(cs.GetLearnersNext()) == 0)
}

// configuration lists the members, voters first, each group by id.
func (n *Node) configuration() ([]server, error) {
	c := n.members.Load()
	if c == nil {
		return nil, fmt.Errorf("the cluster configuration is not known yet")
	}
	cs := c.confState()
	var out []server
	add := func(ids []uint64, suffrage string) {
		var group []server
		for _, id := range ids {
			m := c.Members[id]
			name := m.ID
			if name == "" {
				name = fmt.Sprintf("%x", id)
			}
			group = append(group, server{ID: name, Address: m.Addr, Suffrage: suffrage, rid: id})
		}
		sort.Slice(group, func(i, j int) bool { return group[i].ID < group[j].ID })
		out = append(out, group...)
	}
	add(cs.GetVoters(), "Voter")
	add(cs.GetLearners(), "Nonvoter")
	return out, nil
}

// memberAddr is the raft address of a raft id: from the membership, else
// as the peer said when it connected (a node that is joining knows its
// leader before it has applied the leader's configuration).
func (n *Node) memberAddr(rid uint64) (member, bool) {
	if c := n.members.Load(); c != nil {
		if m, ok := c.Members[rid]; ok {
			return m, true
		}
	}
	return n.tr.learned(rid)
}

// applyConf applies a configuration change entry (the apply thread).
func (n *Node) applyConf(e *pb.Entry) error {
	cur := n.logs.confRecord()
	if e.GetIndex() <= cur.Index {
		return nil // applied before a restart
	}
	var cc pb.ConfChangeI
	var ctx []byte
	if e.GetType() == pb.EntryConfChange {
		c := &pb.ConfChange{}
		if err := proto.Unmarshal(e.GetData(), c); err != nil {
			return err
		}
		cc, ctx = c, c.GetContext()
	} else {
		c := &pb.ConfChangeV2{}
		if err := proto.Unmarshal(e.GetData(), c); err != nil {
			return err
		}
		cc, ctx = c, c.GetContext()
	}
	var cx confCtx
	if len(ctx) > 0 {
		if err := json.Unmarshal(ctx, &cx); err != nil {
			return fmt.Errorf("decode the change's context: %w", err)
		}
	}
	members := maps.Clone(cur.Members)
	if members == nil {
		members = map[uint64]member{}
	}
	for _, ch := range cc.AsV2().GetChanges() {
		switch ch.GetType() {
		case pb.ConfChangeAddNode, pb.ConfChangeAddLearnerNode:
			if cx.ID != "" {
				members[ch.GetNodeId()] = member{ID: cx.ID, Addr: cx.Addr}
			}
		case pb.ConfChangeRemoveNode:
			delete(members, ch.GetNodeId())
		}
	}
	res := make(chan *pb.ConfState, 1)
	select {
	case n.funcs <- func(rn *etcdraft.RawNode) { res <- rn.ApplyConfChange(cc) }:
	case <-n.loopDone:
		return ErrShutdown
	}
	cs := <-res
	rec := confRecord{Index: e.GetIndex(), Members: members}
	var err error
	if rec.Conf, err = marshalConfState(cs); err != nil {
		return err
	}
	if err := n.logs.setConf(rec); err != nil {
		return err
	}
	n.setMembers(rec)
	if cx.Token != "" {
		if ch, ok := n.confWait.LoadAndDelete(cx.Token); ok {
			close(ch.(chan struct{}))
		}
	}
	return nil
}

// changeConf proposes one configuration change on the leader and waits
// until it is applied here. Changes are made one at a time.
func (n *Node) changeConf(ctx context.Context, typ pb.ConfChangeType, id, addr string) error {
	n.confMu.Lock()
	defer n.confMu.Unlock()
	if !n.IsLeader() {
		return ErrNotLeader
	}
	var tok [12]byte
	rand.Read(tok[:])
	cx := confCtx{Token: hex.EncodeToString(tok[:]), ID: id, Addr: addr}
	b, _ := json.Marshal(&cx)
	cc := &pb.ConfChangeV2{Changes: []*pb.ConfChangeSingle{{Type: typ.Enum(), NodeId: new(raftID(id))}}, Context: b}
	done := make(chan struct{})
	n.confWait.Store(cx.Token, done)
	defer n.confWait.Delete(cx.Token)
	errc := make(chan error, 1)
	select {
	case n.funcs <- func(rn *etcdraft.RawNode) { errc <- rn.ProposeConfChange(cc) }:
	case <-n.closing:
		return ErrShutdown
	}
	if err := <-errc; err != nil {
		return fmt.Errorf("%w: %v", ErrNotLeader, err)
	}
	wait := time.NewTimer(timeoutOf(ctx, 10*time.Second))
	defer wait.Stop()
	select {
	case <-done:
		return nil
	case <-wait.C:
		return fmt.Errorf("%w: the configuration change was not applied in time (another change may have been in flight); try again", ErrNotLeader)
	case <-ctx.Done():
		return ctx.Err()
	case <-n.closing:
		return ErrShutdown
	case <-n.halted:
		return n.HaltError()
	}
}

// bootstrapPeers are the raft peers of a new cluster, in the same order on
// every node, each with its id and address as context.
func bootstrapPeers(peers []Peer) []etcdraft.Peer {
	ps := append([]Peer(nil), peers...)
	sort.Slice(ps, func(i, j int) bool { return ps[i].ID < ps[j].ID })
	out := make([]etcdraft.Peer, len(ps))
	for i, p := range ps {
		b, _ := json.Marshal(&confCtx{ID: p.ID, Addr: p.Address})
		out[i] = etcdraft.Peer{ID: raftID(p.ID), Context: b}
	}
	return out
}
