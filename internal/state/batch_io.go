package state

import (
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// get reads a key through the batch; it returns a copy, or nil if absent.
// A read error stops the batch (see fail): "absent" would be a guess.
func (t *txn) get(k []byte) []byte {
	t.s.pointReads++
	v, closer, err := t.b.Get(k)
	if err != nil {
		if !errors.Is(err, pebble.ErrNotFound) {
			t.fail(k, "read", err)
		}
		return nil
	}
	out := append([]byte(nil), v...)
	closer.Close()
	return out
}

func (t *txn) set(k, v []byte) {
	if err := t.b.Set(k, v, nil); err != nil {
		t.fail(k, "write", err)
	}
}

func (t *txn) del(k []byte) {
	if err := t.b.Delete(k, nil); err != nil {
		t.fail(k, "delete", err)
	}
}

func (t *txn) delRange(prefix []byte) {
	if err := t.b.DeleteRange(prefix, prefixEnd(prefix), nil); err != nil {
		t.fail(prefix, "delete the range", err)
	}
}

func (t *txn) iter(prefix []byte) *pebble.Iterator {
	return t.iterRange(prefix, prefixEnd(prefix))
}

func (t *txn) iterRange(lo, hi []byte) *pebble.Iterator {
	it, err := t.b.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		t.fail(lo, "scan", err)
		return nil
	}
	return it
}

// closeIter closes an iterator of the batch; an error it met while
// iterating (a failed read) stops the batch.
func (t *txn) closeIter(it *pebble.Iterator) {
	k := append([]byte(nil), it.Key()...)
	if err := it.Close(); err != nil {
		t.fail(k, "scan", err)
	}
}

// corrupt stops the batch on a record that cannot be decoded.
func (t *txn) corrupt(k []byte, what string, err error) {
	t.fail(k, "decode the "+what+" record at", fmt.Errorf("%w: %v", ErrCorruptRecord, err))
}
