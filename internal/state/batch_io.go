package state

import (
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// get reads a key through the batch; it returns a copy, or nil if absent.
// A read error stops the batch (see fail): "absent" would be a guess.
func (ac *applyCtx) get(k []byte) []byte {
	ac.s.pointReads++
	v, closer, err := ac.b.Get(k)
	if err != nil {
		if !errors.Is(err, pebble.ErrNotFound) {
			ac.fail(k, "read", err)
		}
		return nil
	}
	out := append([]byte(nil), v...)
	closer.Close()
	return out
}

// has reports whether a key exists (an empty value counts).
func (ac *applyCtx) has(k []byte) bool {
	ac.s.pointReads++
	_, closer, err := ac.b.Get(k)
	if err != nil {
		if !errors.Is(err, pebble.ErrNotFound) {
			ac.fail(k, "read", err)
		}
		return false
	}
	closer.Close()
	return true
}

func (ac *applyCtx) set(k, v []byte) {
	if err := ac.b.Set(k, v, nil); err != nil {
		ac.fail(k, "write", err)
	}
}

// setParts writes k with the value head followed by tail, encoded in
// place in the batch (one copy of each part).
func (ac *applyCtx) setParts(k, head, tail []byte) {
	if len(tail) == 0 {
		ac.set(k, head)
		return
	}
	op := ac.b.SetDeferred(len(k), len(head)+len(tail))
	copy(op.Key, k)
	copy(op.Value[copy(op.Value, head):], tail)
	if err := op.Finish(); err != nil {
		ac.fail(k, "write", err)
	}
}

func (ac *applyCtx) del(k []byte) {
	if err := ac.b.Delete(k, nil); err != nil {
		ac.fail(k, "delete", err)
	}
}

func (ac *applyCtx) delRange(prefix []byte) {
	if err := ac.b.DeleteRange(prefix, prefixEnd(prefix), nil); err != nil {
		ac.fail(prefix, "delete the range", err)
	}
}

func (ac *applyCtx) iter(prefix []byte) *pebble.Iterator {
	return ac.iterRange(prefix, prefixEnd(prefix))
}

func (ac *applyCtx) iterRange(lo, hi []byte) *pebble.Iterator {
	it, err := ac.b.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		ac.fail(lo, "scan", err)
		return nil
	}
	return it
}

// closeIter closes an iterator of the batch; an error it met while
// iterating (a failed read) stops the batch.
func (ac *applyCtx) closeIter(it *pebble.Iterator) {
	k := append([]byte(nil), it.Key()...)
	if err := it.Close(); err != nil {
		ac.fail(k, "scan", err)
	}
}

// corrupt stops the batch on a record that cannot be decoded.
func (ac *applyCtx) corrupt(k []byte, what string, err error) {
	ac.fail(k, "decode the "+what+" record at", fmt.Errorf("%w: %v", ErrCorruptRecord, err))
}
