package cluster

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	etcdraft "go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// transport carries raft messages between nodes over the node port
// (mux.go, after peer authentication): a connection starts with a hello
// naming the sender (its raft id, node id and address), then raft messages,
// each a uvarint length and the marshalled raftpb.Message. Messages to one
// peer go in order on one connection; a snapshot (MsgSnap) goes on a
// connection of its own, its message followed by the snapshot's files as a
// stream (snapstore.go), so that heartbeats keep flowing meanwhile. A
// message that cannot be sent is dropped: raft sends again.
type transport struct {
	n    *Node
	self uint64

	mu      sync.Mutex
	peers   map[uint64]*peerSender
	heard   map[uint64]member // senders' own account of themselves
	conns   map[net.Conn]struct{}
	closed  bool
	closing chan struct{}
	wg      sync.WaitGroup
}

type hello struct {
	From uint64 `json:"from"`
	ID   string `json:"id"`
	Addr string `json:"address"`
}

// maxFrame bounds one message on the wire (entries are at most 8 MiB, and
// a message carries a few of them at most).
const maxFrame = 256 << 20

// peerQueue is how many messages wait for one peer before new ones drop.
const peerQueue = 4096

func newTransport(n *Node) *transport {
	return &transport{n: n, self: n.rid, peers: map[uint64]*peerSender{}, heard: map[uint64]member{},
		conns: map[net.Conn]struct{}{}, closing: make(chan struct{})}
}

func (t *transport) learned(rid uint64) (member, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m, ok := t.heard[rid]
	return m, ok
}

// send queues a message for its peer; it never blocks.
func (t *transport) send(m *pb.Message) {
	if m.GetType() == pb.MsgSnap {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return
		}
		t.wg.Add(1)
		t.mu.Unlock()
		go func() {
			defer t.wg.Done()
			t.sendSnapshot(m)
		}()
		return
	}
	p := t.peer(m.GetTo())
	if p == nil {
		return
	}
	select {
	case p.q <- m:
	default:
	}
}

func (t *transport) peer(rid uint64) *peerSender {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	p := t.peers[rid]
	if p == nil {
		p = &peerSender{t: t, rid: rid, q: make(chan *pb.Message, peerQueue)}
		t.peers[rid] = p
		t.wg.Add(1)
		go p.run()
	}
	return p
}

func (t *transport) reportUnreachable(rid uint64) {
	select {
	case t.n.funcs <- func(rn *etcdraft.RawNode) { rn.ReportUnreachable(rid) }:
	case <-t.closing:
	case <-t.n.loopDone:
	}
}

// dial opens a raft connection to a peer and says hello.
func (t *transport) dial(rid uint64) (net.Conn, *bufio.Writer, error) {
	m, ok := t.n.memberAddr(rid)
	if !ok || m.Addr == "" {
		return nil, nil, fmt.Errorf("no address known for raft id %x", rid)
	}
	c, err := t.n.mux.dial(m.Addr, headerRaft, 2*time.Second)
	if err != nil {
		return nil, nil, err
	}
	if !t.track(c) {
		c.Close()
		return nil, nil, ErrShutdown
	}
	bw := bufio.NewWriterSize(c, 256<<10)
	b, _ := json.Marshal(&hello{From: t.self, ID: t.n.id, Addr: t.n.cfg.Advertise})
	if err := writeFrame(bw, b); err != nil {
		t.untrack(c)
		return nil, nil, err
	}
	return c, bw, nil
}

func writeFrame(w io.Writer, b []byte) error {
	var hdr [binary.MaxVarintLen64]byte
	k := binary.PutUvarint(hdr[:], uint64(len(b)))
	if _, err := w.Write(hdr[:k]); err != nil {
		return err
	}
	_, err := w.Write(b)
	return err
}

func readFrame(br *bufio.Reader, buf []byte) ([]byte, error) {
	l, err := binary.ReadUvarint(br)
	if err != nil {
		return nil, err
	}
	if l > maxFrame {
		return nil, fmt.Errorf("raft frame of %d bytes is over the limit of %d", l, maxFrame)
	}
	if uint64(cap(buf)) < l {
		buf = make([]byte, l)
	}
	buf = buf[:l]
	if _, err := io.ReadFull(br, buf); err != nil {
		return nil, noEOF(err)
	}
	return buf, nil
}

// peerSender writes the messages to one peer.
type peerSender struct {
	t   *transport
	rid uint64
	q   chan *pb.Message
}

func (p *peerSender) run() {
	defer p.t.wg.Done()
	var (
		c  net.Conn
		bw *bufio.Writer
	)
	defer func() {
		if c != nil {
			p.t.untrack(c)
		}
	}()
	for {
		var m *pb.Message
		select {
		case m = <-p.q:
		case <-p.t.closing:
			return
		}
		if c == nil {
			var err error
			if c, bw, err = p.t.dial(p.rid); err != nil {
				c = nil
				p.t.n.log.Debug("raft peer unreachable", "to", fmt.Sprintf("%x", p.rid), "err", err)
				p.t.reportUnreachable(p.rid)
				// Drop what waits; raft sends again.
				select {
				case <-time.After(100 * time.Millisecond):
				case <-p.t.closing:
					return
				}
				for len(p.q) > 0 {
					<-p.q
				}
				continue
			}
		}
		err := p.write(c, bw, m)
		for err == nil && len(p.q) > 0 {
			err = p.write(c, bw, <-p.q)
		}
		if err == nil {
			c.SetWriteDeadline(time.Now().Add(10 * time.Second))
			err = bw.Flush()
		}
		if err != nil {
			p.t.untrack(c)
			c = nil
			p.t.reportUnreachable(p.rid)
		}
	}
}

func (p *peerSender) write(c net.Conn, bw *bufio.Writer, m *pb.Message) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	return writeFrame(bw, b)
}

// sendSnapshot sends a MsgSnap with the snapshot's files and tells raft how
// it went.
func (t *transport) sendSnapshot(m *pb.Message) {
	to := m.GetTo()
	status := etcdraft.SnapshotFailure
	defer func() {
		select {
		case t.n.funcs <- func(rn *etcdraft.RawNode) { rn.ReportSnapshot(to, status) }:
		case <-t.closing:
		case <-t.n.loopDone:
		}
	}()
	sd, err := decodeSnapData(m.GetSnapshot().GetData())
	if err != nil {
		t.n.log.Warn("cannot send a snapshot", "to", to, "err", err)
		return
	}
	_, rc, err := t.n.fsm.snaps.Open(sd.ID)
	if err != nil {
		t.n.log.Warn("cannot open the snapshot to send", "id", sd.ID, "err", err)
		return
	}
	defer rc.Close()
	c, bw, err := t.dial(to)
	if err != nil {
		return
	}
	defer t.untrack(c)
	start := time.Now()
	b, err := proto.Marshal(m)
	if err == nil {
		err = writeFrame(bw, b)
	}
	var sent int64
	if err == nil {
		sent, err = io.Copy(bw, rc)
	}
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		// The receiver closes once it has the snapshot on disk.
		c.SetReadDeadline(time.Now().Add(5 * time.Minute))
		var ack [1]byte
		if _, err = io.ReadFull(c, ack[:]); err == nil && ack[0] != 1 {
			err = errors.New("the receiver refused the snapshot")
		}
	}
	if err != nil {
		t.n.log.Warn("sending a snapshot failed; raft tries again", "id", sd.ID, "to", to, "err", err)
		return
	}
	status = etcdraft.SnapshotFinish
	t.n.log.Info("sent a snapshot", "id", sd.ID, "to", to, "bytes", sent, "took", time.Since(start).Round(time.Millisecond))
}

func (t *transport) track(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.conns[c] = struct{}{}
	return true
}

func (t *transport) untrack(c net.Conn) {
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
	c.Close()
}

// accept serves the raft connections the node port accepts.
func (t *transport) accept() {
	defer t.wg.Done()
	for {
		c, err := t.n.mux.Accept()
		if err != nil {
			return
		}
		if !t.track(c) {
			c.Close()
			return
		}
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			defer t.untrack(c)
			t.serve(c)
		}()
	}
}

// serve reads one raft connection.
func (t *transport) serve(c net.Conn) {
	br := bufio.NewReaderSize(c, 256<<10)
	c.SetReadDeadline(time.Now().Add(headerTimeout))
	b, err := readFrame(br, nil)
	if err != nil {
		return
	}
	var h hello
	if err := json.Unmarshal(b, &h); err != nil || h.From == 0 {
		t.n.log.Debug("closing a raft connection without a hello", "remote", c.RemoteAddr().String())
		return
	}
	c.SetReadDeadline(time.Time{})
	t.mu.Lock()
	t.heard[h.From] = member{ID: h.ID, Addr: h.Addr}
	t.mu.Unlock()
	var buf []byte
	for {
		if buf, err = readFrame(br, buf); err != nil {
			return
		}
		m := &pb.Message{}
		if err := proto.Unmarshal(buf, m); err != nil {
			t.n.log.Debug("closing a raft connection with a bad message", "remote", c.RemoteAddr().String(), "err", err)
			return
		}
		if m.GetTo() != t.self || m.GetFrom() != h.From {
			// For another node (an address that changed hands) or not
			// from the node that said hello.
			continue
		}
		if m.GetType() == pb.MsgSnap {
			err := t.receiveSnapshot(m, br)
			ack := byte(1)
			if err != nil {
				ack = 0
				t.n.log.Warn("receiving a snapshot failed", "from", h.ID, "err", err)
			}
			c.SetWriteDeadline(time.Now().Add(10 * time.Second))
			c.Write([]byte{ack})
			if err != nil {
				return
			}
		}
		if m.GetFrom() == t.n.leadID.Load() {
			t.n.lastContact.Store(time.Now().UnixNano())
		}
		select {
		case t.n.recv <- m:
		case <-t.closing:
			return
		}
	}
}

// receiveSnapshot writes the stream after a MsgSnap into the snapshot
// store, before raft sees the message.
func (t *transport) receiveSnapshot(m *pb.Message, br *bufio.Reader) error {
	snap := m.GetSnapshot()
	sd, err := decodeSnapData(snap.GetData())
	if err != nil {
		return err
	}
	md := snap.GetMetadata()
	conf, _ := marshalConfState(md.GetConfState())
	sink, err := t.n.fsm.snaps.Create(sd.ID, md.GetIndex(), md.GetTerm(), conf, sd.Members)
	if err != nil {
		return err
	}
	if _, err := io.Copy(sink, &streamReader{br: br}); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

// streamReader reads one snapshot stream (snapstore.go) and stops at its
// end, leaving the connection's next bytes unread.
type streamReader struct {
	br    *bufio.Reader
	buf   []byte
	state int // 0 header, 1 file name, 2 file body, 3 done
	left  int64
}

func (s *streamReader) Read(p []byte) (int, error) {
	for len(s.buf) == 0 {
		switch s.state {
		case 3:
			return 0, io.EOF
		case 0:
			head := make([]byte, len(streamMagic))
			if _, err := io.ReadFull(s.br, head); err != nil {
				return 0, noEOF(err)
			}
			id, err := readName(s.br)
			if err != nil {
				return 0, err
			}
			s.buf = append(head, lenName(id)...)
			s.state = 1
		case 1:
			name, err := readName(s.br)
			if err != nil {
				return 0, err
			}
			s.buf = lenName(name)
			if len(name) == 0 {
				s.state = 3
				break
			}
			var hdr [8]byte
			if _, err := io.ReadFull(s.br, hdr[:]); err != nil {
				return 0, noEOF(err)
			}
			s.buf = append(s.buf, hdr[:]...)
			s.left = int64(binary.BigEndian.Uint64(hdr[:]))
			s.state = 2
		case 2:
			if s.left == 0 {
				s.state = 1
				continue
			}
			k := min(int64(len(p)), s.left)
			n, err := s.br.Read(p[:k])
			s.left -= int64(n)
			if n == 0 && err != nil {
				return 0, noEOF(err)
			}
			return n, nil
		}
	}
	n := copy(p, s.buf)
	s.buf = s.buf[n:]
	return n, nil
}

func lenName(b []byte) []byte {
	out := make([]byte, 2, 2+len(b))
	binary.BigEndian.PutUint16(out, uint16(len(b)))
	return append(out, b...)
}

// close stops sending and closes every raft connection.
func (t *transport) close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	close(t.closing)
	for c := range t.conns {
		c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
}
