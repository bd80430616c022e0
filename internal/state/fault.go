package state

import (
	"errors"
	"fmt"
)

// The storage-error rule: a command is applied from what the store holds,
// so a read that failed, a record that does not decode, a write that
// Pebble refused or a log entry this code cannot read leaves the state
// machine unable to compute the same result as the other nodes. ApplyBatch
// then commits nothing of the batch, returns an *ApplyError, and refuses
// every later batch with it (the store is halted): the caller must stop
// the node. The entries stay in the Raft log, so a restart on a repaired
// or upgraded node applies them again. Guessing ("absent", "skip it")
// would make this node diverge from the others in silence.

// ErrCorruptRecord marks a stored record that cannot be decoded.
var ErrCorruptRecord = errors.New("undecodable record")

// ErrUnknownCommand marks a log entry written by a newer version: a
// command kind or an entry format this node does not know.
var ErrUnknownCommand = errors.New("unknown command kind")

// ApplyError is why a store stopped applying the log.
type ApplyError struct {
	Index uint64 // the log entry being applied
	Key   []byte // the key being read or written, when there is one
	Op    string // what was being done: read, write, decode the ... record at
	Err   error
}

func (e *ApplyError) Error() string {
	var what string
	switch {
	case e.Op == "decode entry":
		what = fmt.Sprintf("log entry %d cannot be decoded", e.Index)
	case e.Key != nil:
		what = fmt.Sprintf("applying log entry %d: %s key %x", e.Index, e.Op, e.Key)
	default:
		what = fmt.Sprintf("applying log entry %d: %s", e.Index, e.Op)
	}
	return fmt.Sprintf("%s: %v; %s", what, e.Err, e.Fix())
}

func (e *ApplyError) Unwrap() error { return e.Err }

// Fix says what the operator should do.
func (e *ApplyError) Fix() string {
	switch {
	case errors.Is(e.Err, ErrUnknownCommand):
		return "this node is older than the cluster: upgrade it to the cluster's version and start it again"
	case errors.Is(e.Err, ErrCorruptRecord):
		return "the store of this node is damaged: stop it, move its data directory away and bring it back as a new member through QUEEN_JOIN, so that it copies the state from the leader (docs/operations.md)"
	default:
		return "the disk of this node failed: check the disk and the file system (dmesg), then start the node again; it re-applies the entry from its log"
	}
}

// fail records the first storage error of the batch; ApplyBatch stops at
// the end of the command.
func (ac *applyCtx) fail(k []byte, op string, err error) {
	if ac.err != nil {
		return
	}
	var key []byte
	if k != nil {
		key = append([]byte{}, k...)
	}
	ac.err = &ApplyError{Index: ac.index, Key: key, Op: op, Err: err}
}

// Halted returns the error that stopped the store, or nil.
func (s *Store) Halted() error {
	if e := s.halted.Load(); e != nil {
		return e
	}
	return nil
}

// halt stops the store for good (until it is opened again).
func (s *Store) halt(e *ApplyError) {
	if s.halted.CompareAndSwap(nil, e) {
		s.log.Error("the state store stopped applying the log", "index", e.Index, "key", fmt.Sprintf("%x", e.Key), "err", e.Err, "fix", e.Fix())
	}
}
