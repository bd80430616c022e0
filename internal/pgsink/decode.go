package pgsink

import (
	"cmp"
	"context"
	"errors"
	"slices"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/connector"
)

// A batch sorted into its partitions and decoded into row operations; the
// next batch is decoded while the database writes the one before.

// group sorts a batch into its partitions, each in offset order.
func (w *worker) group(msgs []broker.Delivery) ([]*item, []*partWork) {
	items := make([]*item, len(msgs))
	all := make([]item, len(msgs))
	byPid := map[uint64]*partWork{}
	var parts []*partWork
	var p *partWork
	for i := range msgs {
		it := &all[i]
		it.m = &msgs[i]
		items[i] = it
		// A pop delivers a partition's messages one after the other: the
		// map is asked once a partition, and a partition's items are a
		// piece of items, which an append fills in place (with the same
		// pointers) until the partition's messages end. Its capacity is
		// cut there: a partition that comes back later gets storage of
		// its own.
		if p == nil || p.pid != it.m.PartitionID {
			if p != nil && p.inItems {
				p.items, p.inItems = p.items[:len(p.items):len(p.items)], false
			}
			p = byPid[it.m.PartitionID]
		}
		if p == nil {
			p = &partWork{pid: it.m.PartitionID, name: it.m.Partition, last: -1, items: items[i:i], inItems: true}
			byPid[p.pid] = p
			parts = append(parts, p)
		}
		p.items = append(p.items, it)
	}
	if p != nil && p.inItems {
		p.items, p.inItems = p.items[:len(p.items):len(p.items)], false
	}
	slices.SortFunc(parts, func(a, b *partWork) int { return cmp.Compare(a.pid, b.pid) })
	byOffset := func(a, b *item) int { return cmp.Compare(a.m.Offset, b.m.Offset) }
	for _, p := range parts {
		// A pop delivers each partition in offset order: usually no sort.
		if !slices.IsSortedFunc(p.items, byOffset) {
			p.items = slices.Clone(p.items) // not items' order
			slices.SortStableFunc(p.items, byOffset)
		}
	}
	return items, parts
}

// decode maps every message onto its ops, holding a slot of the node's
// connector CPU pool. With parts, the messages are decoded in their
// partitions' order, the order classify writes them in: a batch's COPY
// lines then lie in its arena as the COPY data of its run
// (contiguousLines).
func (w *worker) decode(ctx context.Context, items []*item, parts []*partWork) error {
	_, err := w.decodeInto(ctx, items, parts, nil)
	return err
}

// decodeInto is decode with the batch's arena, ops and scratch taken from
// bufs when they are large enough (else new ones), and returns them:
// whoever knows the batch's lines are no longer needed (its COMMIT
// confirmed) hands them back (recycle).
func (w *worker) decodeInto(ctx context.Context, items []*item, parts []*partWork, bufs *decodeBufs) (*decodeBufs, error) {
	if w.s.env.CPU != nil {
		if err := w.s.env.CPU.Acquire(ctx); err != nil {
			return nil, err
		}
		defer w.s.env.CPU.Release()
	}
	// The common message's op and COPY line go into two allocations for
	// the batch instead of two each, or into bufs'.
	var sc *rowScratch
	var fast []op
	if p := w.plan; p.copy != nil && (w.s.spec.Mode == connector.ModeAppend || w.s.spec.Mode == connector.ModeUpsert) {
		n := 0
		for _, it := range items {
			n += len(it.m.Payload) + 8
		}
		if bufs == nil || cap(bufs.sc.arena) < n || cap(bufs.ops) < len(items) {
			bufs = &decodeBufs{sc: rowScratch{arena: make([]byte, 0, n)}, ops: make([]op, 0, len(items))}
		}
		bufs.sc.reset()
		sc, fast = &bufs.sc, bufs.ops[:0]
	} else {
		bufs = nil
	}
	one := func(it *item) error {
		if it.ops != nil || it.decErr != nil {
			return nil
		}
		if fast != nil {
			if o, ok := w.s.fastRowOp(w.plan, it.m, sc); ok && len(fast) < cap(fast) {
				fast = append(fast, o)
				it.ops = fast[len(fast)-1 : len(fast) : len(fast)]
				return nil
			}
		}
		ops, err := w.s.decode(w.plan, it.m)
		var r *refusal
		switch {
		case errors.As(err, &r):
			it.decErr = err
		case err != nil:
			return err
		default:
			it.ops = ops
		}
		return nil
	}
	if parts == nil {
		for _, it := range items {
			if err := one(it); err != nil {
				return nil, err
			}
		}
		return bufs, nil
	}
	for _, p := range parts {
		for _, it := range p.items {
			if err := one(it); err != nil {
				return nil, err
			}
		}
	}
	return bufs, nil
}

// decodeBufs is a batch's decode storage: its COPY lines (in sc's arena),
// its ops, the scratch.
type decodeBufs struct {
	sc  rowScratch
	ops []op
}

// maxFreeBufs bounds the decode storage a worker keeps for its next
// batches: about as many as it has batches decoded at a time.
const maxFreeBufs = maxFlights + popAheadShared + 1

// takeBufs is decode storage a batch before left, or nil.
func (w *worker) takeBufs() *decodeBufs {
	w.rmu.Lock()
	defer w.rmu.Unlock()
	n := len(w.freeBufs)
	if n == 0 {
		return nil
	}
	b := w.freeBufs[n-1]
	w.freeBufs[n-1] = nil
	w.freeBufs = w.freeBufs[:n-1]
	return b
}

// recycle hands back a batch's decode storage once its transaction is
// committed: nothing reads its ops or lines again (a batch done again is
// decoded again). An outsized one is dropped.
func (w *worker) recycle(pre *decodedBatch) {
	if pre == nil || pre.bufs == nil {
		return
	}
	b := pre.bufs
	pre.bufs = nil
	if cap(b.sc.arena) > maxWireKeep {
		return
	}
	w.rmu.Lock()
	defer w.rmu.Unlock()
	if len(w.freeBufs) < maxFreeBufs {
		w.freeBufs = append(w.freeBufs, b)
	}
}
