package cluster

import (
	"bufio"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"net"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/queen-mq/queen/internal/state"
)

// The node RPC: requests and responses are gob values on a connection that
// starts with headerRPC. One connection per peer carries any number of
// concurrent calls, matched by sequence number.

const (
	opSubmit byte = iota + 1
	opReadIndex
	opStatus
	opJoin
	opRemove
	opWaitSynced
)

const (
	codeOK        byte = iota
	codeNotLeader      // refused before anything happened
	codeMaybe          // may have been applied
	codeUnknown        // the leader cannot tell whether it was applied
	codeFailed         // refused with a message
)

type rpcRequest struct {
	Seq       uint64
	Op        byte
	ReqID     reqID
	Retry     bool
	MinIndex  uint64
	Entry     []byte // a state entry holding the one command
	Size      int
	TimeoutNs int64
	MemberID  string
	Address   string
	Checksum  bool
}

type rpcResponse struct {
	Seq    uint64
	Code   byte
	Msg    string
	ECode  string // API error code of a codeFailed refusal
	Result any
	Index  uint64
	Node   *NodeStatus
}

func init() {
	for _, v := range []any{
		&state.PushResult{}, &state.PopResult{}, &state.AckResult{}, &state.ExtendResult{},
		&state.ConfigureResult{}, &state.CountResult{}, &state.TxnResult{},
	} {
		gob.Register(v)
	}
}

// rpcTimeout bounds calls that do not carry the caller's deadline (dialing,
// status, a stuck write).
const rpcTimeout = 5 * time.Second

// rpcClient keeps one multiplexed connection per peer address.
type rpcClient struct {
	n      *Node
	mu     sync.Mutex
	conns  map[string]*clientConn
	closed bool
}

func newRPCClient(n *Node) *rpcClient { return &rpcClient{n: n, conns: map[string]*clientConn{}} }

type clientConn struct {
	addr string
	c    net.Conn
	wmu  sync.Mutex
	bw   *bufio.Writer
	enc  *gob.Encoder

	mu      sync.Mutex
	seq     uint64
	pending map[uint64]chan *rpcResponse
	dead    chan struct{}
	err     error

	lastRead atomic.Int64 // unix nanos of the last response read
}

func (rc *rpcClient) close() {
	rc.mu.Lock()
	rc.closed = true
	conns := rc.conns
	rc.conns = map[string]*clientConn{}
	rc.mu.Unlock()
	for _, cc := range conns {
		cc.fail(ErrShutdown)
	}
}

func (rc *rpcClient) get(addr string) (*clientConn, error) {
	rc.mu.Lock()
	if rc.closed {
		rc.mu.Unlock()
		return nil, ErrShutdown
	}
	if cc := rc.conns[addr]; cc != nil {
		rc.mu.Unlock()
		return cc, nil
	}
	rc.mu.Unlock()
	c, err := rc.n.mux.dial(addr, headerRPC, 2*time.Second)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	bw := bufio.NewWriter(c)
	cc := &clientConn{addr: addr, c: c, bw: bw, enc: gob.NewEncoder(bw), pending: map[uint64]chan *rpcResponse{}, dead: make(chan struct{})}
	rc.mu.Lock()
	if rc.closed {
		rc.mu.Unlock()
		c.Close()
		return nil, ErrShutdown
	}
	if old := rc.conns[addr]; old != nil {
		rc.mu.Unlock()
		c.Close()
		return old, nil
	}
	rc.conns[addr] = cc
	rc.mu.Unlock()
	go rc.readLoop(cc)
	return cc, nil
}

func (rc *rpcClient) readLoop(cc *clientConn) {
	dec := gob.NewDecoder(bufio.NewReader(cc.c))
	for {
		var resp rpcResponse
		if err := dec.Decode(&resp); err != nil {
			cc.fail(fmt.Errorf("connection to %s lost: %w", cc.addr, err))
			break
		}
		cc.lastRead.Store(time.Now().UnixNano())
		cc.mu.Lock()
		ch := cc.pending[resp.Seq]
		delete(cc.pending, resp.Seq)
		cc.mu.Unlock()
		if ch != nil {
			ch <- &resp
		}
	}
	rc.mu.Lock()
	if rc.conns[cc.addr] == cc {
		delete(rc.conns, cc.addr)
	}
	rc.mu.Unlock()
}

func (cc *clientConn) fail(err error) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	select {
	case <-cc.dead:
		return
	default:
	}
	cc.err = err
	close(cc.dead)
	cc.c.Close()
}

// errNotSent marks a call that failed before its request left this node.
type errNotSent struct{ err error }

func (e *errNotSent) Error() string { return e.err.Error() }
func (e *errNotSent) Unwrap() error { return e.err }

// call sends req to addr and waits for the response. abandon, checked
// every 50 ms, gives up early (the leader changed). An error of type
// *errNotSent means the peer never saw the request.
func (rc *rpcClient) call(ctx context.Context, addr string, req *rpcRequest, abandon func() bool) (*rpcResponse, error) {
	cc, err := rc.get(addr)
	if err != nil {
		return nil, &errNotSent{err}
	}
	ch := make(chan *rpcResponse, 1)
	cc.mu.Lock()
	select {
	case <-cc.dead:
		cc.mu.Unlock()
		return nil, &errNotSent{cc.err}
	default:
	}
	cc.seq++
	req.Seq = cc.seq
	cc.pending[req.Seq] = ch
	cc.mu.Unlock()
	forget := func() {
		cc.mu.Lock()
		delete(cc.pending, req.Seq)
		cc.mu.Unlock()
	}
	sent := time.Now()
	cc.wmu.Lock()
	cc.c.SetWriteDeadline(time.Now().Add(rpcTimeout))
	err = cc.enc.Encode(req)
	if err == nil {
		err = cc.bw.Flush()
	}
	cc.wmu.Unlock()
	if err != nil {
		forget()
		cc.fail(fmt.Errorf("write to %s: %w", addr, err))
		// Part of it may have left: the peer may act on it.
		return nil, fmt.Errorf("send to %s: %w", addr, err)
	}
	var tick <-chan time.Time
	if abandon != nil {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		tick = t.C
	}
	giveUp := func(err error) (*rpcResponse, error) {
		forget()
		// A peer that answered nothing since this request was sent may be
		// cut off (no reset ever comes): start afresh next time.
		if cc.lastRead.Load() < sent.UnixNano() {
			cc.fail(err)
		}
		return nil, err
	}
	for {
		select {
		case resp := <-ch:
			return resp, nil
		case <-cc.dead:
			forget()
			return nil, cc.err
		case <-ctx.Done():
			return giveUp(ctx.Err())
		case <-tick:
			if abandon() {
				return giveUp(fmt.Errorf("leader changed while waiting for %s", addr))
			}
		}
	}
}

func timeoutOf(ctx context.Context, def time.Duration) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		if d := time.Until(dl); d < def {
			return d
		}
	}
	return def
}

// forwardSubmit sends a command to the leader at addr.
func (n *Node) forwardSubmit(ctx context.Context, addr string, req *request) (any, outcome, error) {
	entry, err := state.EncodeEntry(&state.Entry{Cmds: []state.Command{req.cmd}})
	if err != nil {
		return nil, outFinal, err
	}
	r := &rpcRequest{Op: opSubmit, ReqID: req.id, Retry: req.retry, MinIndex: req.minIndex, Entry: entry, Size: req.size,
		TimeoutNs: int64(timeoutOf(ctx, 30*time.Second))}
	resp, err := n.rpc.call(ctx, addr, r, func() bool {
		a, _ := n.LeaderAddr()
		return a != "" && a != addr
	})
	if err != nil {
		var ns *errNotSent
		if errors.As(err, &ns) {
			return nil, outNotApplied, err
		}
		return nil, outMaybe, err
	}
	switch resp.Code {
	case codeOK:
		return resp.Result, outNotApplied, nil
	case codeNotLeader:
		return nil, outNotApplied, fmt.Errorf("%w: %s", ErrNotLeader, resp.Msg)
	case codeMaybe:
		return nil, outMaybe, errors.New(resp.Msg)
	case codeUnknown:
		return nil, outFinal, ErrOutcomeUnknown
	default:
		return nil, outFinal, remoteError(resp)
	}
}

// readIndex asks the leader at addr for a read index.
func (rc *rpcClient) readIndex(ctx context.Context, addr string) (uint64, error) {
	resp, err := rc.call(ctx, addr, &rpcRequest{Op: opReadIndex, TimeoutNs: int64(timeoutOf(ctx, rpcTimeout))}, func() bool {
		a, _ := rc.n.LeaderAddr()
		return a != "" && a != addr
	})
	if err != nil {
		return 0, err
	}
	if resp.Code != codeOK {
		return 0, fmt.Errorf("%w: read index from %s: %s", ErrNotLeader, addr, resp.Msg)
	}
	return resp.Index, nil
}

func remoteError(resp *rpcResponse) error {
	if resp.ECode != "" {
		return &Error{Code: resp.ECode, Message: resp.Msg}
	}
	return errors.New(resp.Msg)
}

// serveRPC answers one node-RPC connection until it closes.
func (n *Node) serveRPC(c net.Conn) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bw := bufio.NewWriter(c)
	enc := gob.NewEncoder(bw)
	var wmu sync.Mutex
	dec := gob.NewDecoder(bufio.NewReader(c))
	for {
		var req rpcRequest
		if err := dec.Decode(&req); err != nil {
			return
		}
		n.rpcGate.RLock()
		if n.closed.Load() {
			n.rpcGate.RUnlock()
			return
		}
		go func() {
			defer n.rpcGate.RUnlock()
			resp := n.handleRPC(ctx, &req)
			resp.Seq = req.Seq
			if v := reflect.ValueOf(resp.Result); resp.Result != nil && v.Kind() == reflect.Pointer && v.IsNil() {
				resp.Result = nil
			}
			wmu.Lock()
			defer wmu.Unlock()
			c.SetWriteDeadline(time.Now().Add(rpcTimeout))
			err := enc.Encode(resp)
			if err == nil {
				err = bw.Flush()
			}
			if err != nil {
				n.log.Debug("node RPC reply failed", "remote", c.RemoteAddr().String(), "err", err)
				c.Close()
			}
		}()
	}
}

func (n *Node) handleRPC(ctx context.Context, req *rpcRequest) *rpcResponse {
	timeout := time.Duration(req.TimeoutNs)
	if timeout <= 0 || timeout > 60*time.Second {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch req.Op {
	case opSubmit:
		en, err := state.DecodeEntry(req.Entry)
		if err != nil || len(en.Cmds) != 1 {
			return &rpcResponse{Code: codeFailed, Msg: fmt.Sprintf("forwarded command does not decode: %v", err)}
		}
		v, oc, err := n.submitLocal(ctx, &request{id: req.ReqID, cmd: en.Cmds[0], size: req.Size, retry: req.Retry, minIndex: req.MinIndex})
		if err == nil {
			return &rpcResponse{Code: codeOK, Result: v}
		}
		switch {
		case errors.Is(err, ErrOutcomeUnknown):
			return &rpcResponse{Code: codeUnknown, Msg: err.Error()}
		case oc == outNotApplied:
			return &rpcResponse{Code: codeNotLeader, Msg: err.Error()}
		case oc == outMaybe || errors.Is(err, ErrShutdown):
			return &rpcResponse{Code: codeMaybe, Msg: err.Error()}
		default:
			var e *Error // a refusal with an API status (a full disk)
			if errors.As(err, &e) {
				return &rpcResponse{Code: codeFailed, Msg: e.Message, ECode: e.Code}
			}
			return &rpcResponse{Code: codeFailed, Msg: err.Error()}
		}
	case opReadIndex:
		idx, err := n.leaderReadIndex(ctx)
		if err != nil {
			return &rpcResponse{Code: codeNotLeader, Msg: err.Error()}
		}
		return &rpcResponse{Code: codeOK, Index: idx}
	case opStatus:
		st := n.LocalStatus(req.Checksum)
		return &rpcResponse{Code: codeOK, Node: &st}
	case opJoin:
		return membershipResponse(n.joinLocal(ctx, req.MemberID, req.Address))
	case opRemove:
		return membershipResponse(n.removeLocal(req.MemberID))
	case opWaitSynced:
		return n.handleWaitSynced(ctx, req)
	}
	return &rpcResponse{Code: codeFailed, Msg: fmt.Sprintf("unknown node RPC %d", req.Op)}
}

func membershipResponse(err error) *rpcResponse {
	if err == nil {
		return &rpcResponse{Code: codeOK}
	}
	if errors.Is(err, ErrNotLeader) {
		return &rpcResponse{Code: codeNotLeader, Msg: err.Error()}
	}
	var e *Error
	if errors.As(err, &e) {
		return &rpcResponse{Code: codeFailed, Msg: e.Message, ECode: e.Code}
	}
	return &rpcResponse{Code: codeFailed, Msg: err.Error()}
}
