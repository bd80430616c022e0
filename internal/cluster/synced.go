package cluster

import (
	"context"
	"errors"
	"fmt"
)

// Fsync is the raft log's durability policy on this node.
func (n *Node) Fsync() FsyncMode { return n.fsync.mode }

// Synced is the index through which this node's raft log is on disk. With
// FsyncAlways it lags the log's last index only by leases not synced yet
// and, on the leader, by its own appends whose fsync is under way.
func (n *Node) Synced() uint64 { return n.fsync.Synced() }

// SyncRounds counts the syncer's rounds that fsynced at least one segment
// (every round with FsyncInterval; with FsyncAlways leases and the
// leader's own appends are left to such a round; tests and metrics watch
// it move).
func (n *Node) SyncRounds() uint64 { return n.fsync.rounds.Load() }

// WaitSynced returns once every write acknowledged before the call is on
// disk in the raft logs of a majority of the voters, so that it survives a
// power loss of any number of nodes. With FsyncAlways that holds for every
// acknowledged write already and it returns at once: each follower that
// counted fsynced before it answered, and the reply waited for the
// leader's fsync (replies.go). A lease is not such a write: losing it is
// its expiry (docs/design/leases.md). With FsyncInterval it
// takes a read index (the leader's commit index, asked over the raft port
// on a follower) and waits until a majority of voters report their logs
// synced through it; each voter syncs early when asked.
func (n *Node) WaitSynced(ctx context.Context) error {
	if n.fsync.mode != FsyncInterval {
		return nil
	}
	idx, err := n.readIndex(ctx)
	if err != nil {
		return err
	}
	return n.waitQuorumSynced(ctx, idx)
}

// readIndex is an index at or above every write acknowledged before the
// call, confirmed by the current leader.
func (n *Node) readIndex(ctx context.Context) (uint64, error) {
	bo := newBackoff()
	var lastErr error
	for {
		if n.closed.Load() {
			return 0, ErrShutdown
		}
		if n.IsLeader() {
			idx, err := n.leaderReadIndex(ctx)
			if err == nil {
				return idx, nil
			}
			lastErr = err
		} else if addr, id := n.LeaderAddr(); addr != "" && id != n.id {
			idx, err := n.rpc.readIndex(ctx, addr)
			if err == nil {
				return idx, nil
			}
			lastErr = err
		} else {
			lastErr = errors.New("no leader is known")
		}
		if !bo.wait(ctx, n.closing) {
			if n.closed.Load() {
				return 0, ErrShutdown
			}
			return 0, fmt.Errorf("%w: no leader gave an index to wait for before the deadline (last error: %v)", ErrNotLeader, lastErr)
		}
	}
}

// waitQuorumSynced waits until a majority of the voters have their logs on
// disk through idx.
func (n *Node) waitQuorumSynced(ctx context.Context, idx uint64) error {
	voters := n.voters()
	if len(voters) == 0 {
		return fmt.Errorf("%w: the cluster configuration is not known", ErrNotLeader)
	}
	need := len(voters)/2 + 1
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(voters))
	for _, v := range voters {
		go func() {
			if v.ID == n.id {
				errs <- n.fsync.waitSynced(ctx.Done(), idx)
				return
			}
			errs <- n.rpc.waitSynced(ctx, v.Address, idx)
		}()
	}
	ok, failed := 0, 0
	var lastErr error
	for range voters {
		err := <-errs
		if err == nil {
			if ok++; ok >= need {
				return nil
			}
			continue
		}
		lastErr = err
		if failed++; len(voters)-failed < need {
			break
		}
	}
	if ctx.Err() != nil {
		return fmt.Errorf("wait for a majority to sync the raft log through index %d: %w", idx, ctx.Err())
	}
	return fmt.Errorf("wait for a majority to sync the raft log through index %d: %d of %d voters failed (last error: %v)", idx, failed, len(voters), lastErr)
}

// waitSynced asks the node at addr to report once its log is on disk
// through idx.
func (rc *rpcClient) waitSynced(ctx context.Context, addr string, idx uint64) error {
	resp, err := rc.call(ctx, addr, &rpcRequest{Op: opWaitSynced, MinIndex: idx, TimeoutNs: int64(timeoutOf(ctx, rpcTimeout))}, nil)
	if err != nil {
		return err
	}
	if resp.Code != codeOK {
		return fmt.Errorf("%s: %s", addr, resp.Msg)
	}
	return nil
}

// handleWaitSynced serves opWaitSynced.
func (n *Node) handleWaitSynced(ctx context.Context, req *rpcRequest) *rpcResponse {
	if err := n.fsync.waitSynced(ctx.Done(), req.MinIndex); err != nil {
		return &rpcResponse{Code: codeFailed, Msg: err.Error()}
	}
	return &rpcResponse{Code: codeOK, Index: n.fsync.Synced()}
}
