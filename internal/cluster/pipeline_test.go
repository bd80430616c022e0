package cluster

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// A pipelined AppendEntries to a peer that never answers blocks once the
// in-flight queue is full; closePipelines (what shutdown does) frees it.
func TestClosePipelinesFreesABlockedSend(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }() // reads, never answers
		}
	}()
	tr, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 10*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	tt := newTrackedTransport(tr)
	p, err := tt.AppendEntriesPipeline("peer", raft.ServerAddress(ln.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		for i := 0; i < 1000; i++ {
			req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("leader"), Addr: []byte("x")}, Term: 1}
			if _, err := p.AppendEntries(req, &raft.AppendEntriesResponse{}); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		t.Fatalf("1000 pipelined sends to a silent peer did not block (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	tt.closePipelines()
	select {
	case err := <-done:
		if !errors.Is(err, raft.ErrPipelineShutdown) {
			t.Fatalf("the blocked send returned %v, want %v", err, raft.ErrPipelineShutdown)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("closing the pipelines did not free the blocked send")
	}
	tt.mu.Lock()
	n := len(tt.pipes)
	tt.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d pipelines still tracked after closing", n)
	}
}
