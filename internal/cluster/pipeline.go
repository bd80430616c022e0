package cluster

import (
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// trackedTransport is raft's network transport with a handle on the
// replication pipelines it opens, so that shutdown can close them.
//
// hashicorp/raft (v1.7.3) can leave a leader's replication goroutine
// blocked for good in a pipelined AppendEntries: when the pipeline's
// response decoder stops (for example on a reply with a newer term, after a
// partition heals) the send waits for room in the in-flight queue, and only
// closing the pipeline frees it. The goroutine then never returns to see
// its stop signal, and Raft.Shutdown waits for it forever. Closing every
// open pipeline during shutdown makes the blocked send fail, so replication
// stops and shutdown completes. Closing a pipeline is safe at any time: raft
// falls back to plain AppendEntries.
type trackedTransport struct {
	*raft.NetworkTransport

	mu    sync.Mutex
	pipes map[*trackedPipeline]struct{}
}

func newTrackedTransport(t *raft.NetworkTransport) *trackedTransport {
	return &trackedTransport{NetworkTransport: t, pipes: map[*trackedPipeline]struct{}{}}
}

// AppendEntriesPipeline opens a pipeline and remembers it until it closes.
func (t *trackedTransport) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	p, err := t.NetworkTransport.AppendEntriesPipeline(id, target)
	if err != nil {
		return nil, err
	}
	tp := &trackedPipeline{AppendPipeline: p, t: t}
	t.mu.Lock()
	t.pipes[tp] = struct{}{}
	t.mu.Unlock()
	return tp, nil
}

// closePipelines closes every open pipeline.
func (t *trackedTransport) closePipelines() {
	t.mu.Lock()
	pipes := make([]*trackedPipeline, 0, len(t.pipes))
	for p := range t.pipes {
		pipes = append(pipes, p)
	}
	t.mu.Unlock()
	for _, p := range pipes {
		p.Close()
	}
}

// shutdownRaft shuts raft down, closing replication pipelines until it
// has (a pipeline opened after one round is closed in the next).
func (t *trackedTransport) shutdownRaft(r *raft.Raft) error {
	f := r.Shutdown()
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	for {
		select {
		case err := <-done:
			return err
		case <-time.After(500 * time.Millisecond):
			t.closePipelines()
		}
	}
}

type trackedPipeline struct {
	raft.AppendPipeline
	t *trackedTransport
}

func (p *trackedPipeline) Close() error {
	p.t.mu.Lock()
	delete(p.t.pipes, p)
	p.t.mu.Unlock()
	return p.AppendPipeline.Close()
}
