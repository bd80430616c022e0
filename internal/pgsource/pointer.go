package pgsource

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"

	"github.com/queen-mq/queen/internal/broker"
)

// pointer is how far a source's messages reach, written in the same broker
// transaction as the messages it covers (docs/design/source.md).
type pointer struct {
	Epoch    string `json:"epoch"`
	SystemID string `json:"systemId"`
	Timeline int32  `json:"timeline"`
	Slot     string `json:"slot"`
	// CommitLSN is the commit position of the last source transaction
	// pushed, whole or in part; Seq is -1 when it was pushed whole, else
	// how many of its changes were.
	CommitLSN lsnJSON `json:"commitLsn"`
	Seq       int     `json:"seq"`
	// FlushLSN is what may be confirmed to PostgreSQL.
	FlushLSN lsnJSON       `json:"flushLsn"`
	Snapshot snapshotState `json:"snapshot"`
	Resync   uint64        `json:"resync"`
}

// snapshotState is the copy's progress, per table.
type snapshotState struct {
	Done   bool                   `json:"done"`
	Tables map[string]*tableState `json:"tables"`
}

type tableState struct {
	Done bool `json:"done"`
	// LastKey is the printed key of the last row pushed (nil: none yet).
	LastKey []string `json:"lastKey"`
}

func (p *pointer) clone() *pointer {
	c := *p
	c.Snapshot.Tables = make(map[string]*tableState, len(p.Snapshot.Tables))
	for k, v := range p.Snapshot.Tables {
		t := *v
		t.LastKey = append([]string(nil), v.LastKey...)
		c.Snapshot.Tables[k] = &t
	}
	return &c
}

// position names how far p reaches, for messages.
func (p *pointer) position() string {
	return fmt.Sprintf("at commit %s seq %d (snapshot done %v)", pglogrepl.LSN(p.CommitLSN), p.Seq, p.Snapshot.Done)
}

// lsnJSON is an LSN written as PostgreSQL prints it.
type lsnJSON pglogrepl.LSN

func (l lsnJSON) MarshalJSON() ([]byte, error) {
	return append(appendLSN([]byte{'"'}, pglogrepl.LSN(l)), '"'), nil
}

func (l *lsnJSON) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := pglogrepl.ParseLSN(s)
	if err != nil {
		return err
	}
	*l = lsnJSON(v)
	return nil
}

// newEpoch is 8 random hex digits, different from prev.
func newEpoch(prev string) string {
	for {
		var b [4]byte
		_, _ = rand.Read(b[:])
		if e := hex.EncodeToString(b[:]); e != prev {
			return e
		}
	}
}

// pointerStore reads and writes one source's pointer with ifVersion.
type pointerStore struct {
	b       *broker.Broker
	tenant  string
	key     string
	version uint64 // of the pointer last read or written; 0 = none
	// writes numbers the pointer last read or written: each write carries
	// the next number, so no two writes of one chain are equal bytes and a
	// write conditioned on its predecessor's value (kv.checkValue) cannot
	// match an earlier one.
	writes uint64
}

// storedPointer is a pointer as written: numbered.
type storedPointer struct {
	*pointer
	Write uint64 `json:"write,omitempty"`
}

// load reads the pointer; nil when there is none.
func (s *pointerStore) load(ctx context.Context) (*pointer, error) {
	e, ok, err := s.b.KVGet(ctx, s.tenant, s.key)
	if err != nil {
		return nil, fmt.Errorf("read the source's pointer %s: %w", s.key, err)
	}
	if !ok {
		s.version, s.writes = 0, 0
		return nil, nil
	}
	p := storedPointer{pointer: &pointer{}}
	if err := json.Unmarshal(e.Value, &p); err != nil {
		return nil, fmt.Errorf("the source's pointer %s is not valid (%v); POST .../resync starts over", s.key, err)
	}
	if p.Snapshot.Tables == nil {
		p.Snapshot.Tables = map[string]*tableState{}
	}
	s.version, s.writes = e.Version, p.Write
	return p.pointer, nil
}

// encode is p as its write number n.
func encodePointer(p *pointer, n uint64) ([]byte, error) {
	return json.Marshal(storedPointer{p, n})
}

// op is the transaction operation that writes p if nobody moved the
// pointer since this store last saw it; wrote records its success.
func (s *pointerStore) op(p *pointer) (broker.TxnOp, error) {
	v, err := encodePointer(p, s.writes+1)
	if err != nil {
		return broker.TxnOp{}, err
	}
	ifv := s.version
	return broker.TxnOp{Type: broker.OpKVPut, Key: s.key, Value: v, IfVersion: &ifv}, nil
}

// wrote records that the write of op (number writes+1) committed as
// version.
func (s *pointerStore) wrote(version uint64) { s.version, s.writes = version, s.writes+1 }

// chained are the operations that write p (as write number n) if the
// pointer holds after, the value of a write still in flight.
func (s *pointerStore) chained(p *pointer, n uint64, after []byte) ([]broker.TxnOp, []byte, error) {
	v, err := encodePointer(p, n)
	if err != nil {
		return nil, nil, err
	}
	return []broker.TxnOp{{Type: broker.OpKVCheckValue, Key: s.key, Value: after}, {Type: broker.OpKVPut, Key: s.key, Value: v}}, v, nil
}

// delete removes the pointer (resync, DELETE).
func (s *pointerStore) delete(ctx context.Context) error {
	if s.version == 0 {
		return nil
	}
	ifv := s.version
	if _, err := s.b.KVDelete(ctx, s.tenant, s.key, &ifv, true); err != nil {
		return fmt.Errorf("delete the source's pointer: %w", err)
	}
	s.version = 0
	return nil
}

// lostError means another owner moved the pointer: this one must stop.
type lostError struct{ err error }

func (e *lostError) Error() string {
	return "another node moved the source's pointer (it owns the source now): " + e.err.Error()
}
func (e *lostError) Unwrap() error { return e.err }

func isConditionFailed(err error) bool {
	var be *broker.Error
	return errors.As(err, &be) && be.Code == "condition_failed"
}
