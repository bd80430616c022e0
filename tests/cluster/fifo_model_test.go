package cluster

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// The FIFO model: one queue partition, pushed to with client-given
// transaction ids and popped in queue mode with autoAck, so a pop is a
// dequeue of the head. Operations on different partitions are independent,
// so the history is checked per partition.
//
// A push appends each of its ids unless the id was pushed before (pushes
// are idempotent per partition by transactionId, also after the message
// was consumed, as long as it is retained). A push answered 201 says per
// item "queued" (this push stored it: it must be new) or "duplicate" (it
// was there already, or this request's own earlier attempt stored it after
// an unknown outcome: either way it is there afterwards). A push with no
// answer may take effect at any time later (its Return is "never"); a
// retry with the same ids is a separate operation.
//
// A pop of batch b answered 200 with k messages dequeues exactly the k
// messages at the head, and k < b only when that emptied the FIFO; 204
// means the FIFO was empty. A pop with no answer may have dequeued the
// min(b, len) head messages, at any time later, or nothing: the model is
// nondeterministic there, so the state is a set of possible head positions
// over the sequence of everything appended.

type fifoInput struct {
	part  string
	push  []string // a push: the transaction ids, in request order
	batch int      // a pop: its batch size
}

type fifoOutput struct {
	unknown bool     // no answer: it may or may not take effect
	dup     []bool   // push answered 201: item i was reported "duplicate"
	got     []string // pop answered: the ids delivered, in order (none: 204)
}

// fifoState is the FIFO from its lowest possible head on, the possible
// positions of the head in it (sorted, distinct, the first 0), and which of
// the ids that several operations push have been appended (sorted). An id
// that only one operation pushes cannot be there before that operation, so
// the state need not remember it once it is consumed: the state stays as
// short as the FIFO. Slices are never modified once a state holds them.
type fifoState struct {
	fifo  []string
	heads []int
	seen  []string
}

// fifoModelFor is the model for a history: it needs to know which ids more
// than one operation pushes (retries of a push without an answer).
func fifoModelFor(history []porcupine.Operation) porcupine.Model {
	pushes := map[string]int{}
	for _, op := range history {
		for _, id := range op.Input.(fifoInput).push {
			pushes[id]++
		}
	}
	m := fifoModel
	m.Step = func(st, in, out any) (bool, any) {
		s, i, o := st.(fifoState), in.(fifoInput), out.(fifoOutput)
		if i.push != nil {
			return fifoPush(s, i, o, func(id string) bool { return pushes[id] > 1 })
		}
		return fifoPop(s, i, o)
	}
	return m
}

func fifoPush(s fifoState, in fifoInput, out fifoOutput, several func(string) bool) (bool, any) {
	fifo, seen := s.fifo, s.seen
	for i, id := range in.push {
		if several(id) {
			if _, there := slices.BinarySearch(seen, id); there {
				if !out.unknown && !out.dup[i] {
					return false, s // answered "queued" for an id that was there
				}
				continue
			}
			seen = slices.Clone(seen)
			j, _ := slices.BinarySearch(seen, id)
			seen = slices.Insert(seen, j, id)
		}
		fifo = append(fifo[:len(fifo):len(fifo)], id)
	}
	return true, fifoState{fifo: fifo, heads: s.heads, seen: seen}
}

func fifoPop(s fifoState, in fifoInput, out fifoOutput) (bool, any) {
	n := len(s.fifo)
	var heads []int
	add := func(h int) {
		if i, found := slices.BinarySearch(heads, h); !found {
			heads = slices.Insert(heads, i, h)
		}
	}
	k := len(out.got)
	for _, h := range s.heads {
		switch {
		case out.unknown:
			add(h)
			add(h + min(in.batch, n-h))
		case k == 0:
			if h == n {
				add(h)
			}
		case k <= in.batch && h+k <= n && slices.Equal(s.fifo[h:h+k], out.got) && (k == in.batch || h+k == n):
			add(h + k)
		}
	}
	if len(heads) == 0 {
		return false, s
	}
	// Forget what every possible head has passed.
	low := heads[0]
	for i := range heads {
		heads[i] -= low
	}
	return true, fifoState{fifo: s.fifo[low:], heads: heads, seen: s.seen}
}

// fifoModel is completed by fifoModelFor (Step).
var fifoModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		return partitionBy(history, func(in any) string { return in.(fifoInput).part })
	},
	Init: func() any { return fifoState{heads: []int{0}} },
	Equal: func(a, b any) bool {
		x, y := a.(fifoState), b.(fifoState)
		return slices.Equal(x.heads, y.heads) && slices.Equal(x.fifo, y.fifo) && slices.Equal(x.seen, y.seen)
	},
	Hash: func(st any) uint64 {
		s := st.(fifoState)
		h := fnv.New64a()
		fmt.Fprint(h, len(s.fifo), s.heads, len(s.seen))
		for _, id := range s.fifo {
			h.Write([]byte(id))
		}
		return h.Sum64()
	},
	DescribeOperation: func(in, out any) string {
		i, o := in.(fifoInput), out.(fifoOutput)
		if i.push != nil {
			res := "ok"
			switch {
			case o.unknown:
				res = "unknown"
			case slices.Contains(o.dup, true):
				res = fmt.Sprintf("ok, duplicate %v", o.dup)
			}
			return fmt.Sprintf("%s: push(%s) -> %s", i.part, strings.Join(i.push, ","), res)
		}
		switch {
		case o.unknown:
			return fmt.Sprintf("%s: pop(%d) -> unknown", i.part, i.batch)
		case len(o.got) == 0:
			return fmt.Sprintf("%s: pop(%d) -> empty", i.part, i.batch)
		}
		return fmt.Sprintf("%s: pop(%d) -> %s", i.part, i.batch, strings.Join(o.got, ","))
	},
	DescribeState: func(st any) string {
		s := st.(fifoState)
		var alts []string
		for _, h := range s.heads {
			alts = append(alts, "["+strings.Join(s.fifo[h:], " ")+"]")
		}
		return strings.Join(alts, " or ")
	},
}

// TestFIFOModel checks the model itself on small hand-made histories: the
// ones a correct queue can produce pass, and lost, reordered, duplicated or
// invented messages fail.
func TestFIFOModel(t *testing.T) {
	push := func(call, ret int64, ids ...string) porcupine.Operation {
		return porcupine.Operation{Input: fifoInput{part: "p", push: ids}, Output: fifoOutput{dup: make([]bool, len(ids))}, Call: call, Return: ret}
	}
	pushDup := func(call, ret int64, id string) porcupine.Operation {
		return porcupine.Operation{Input: fifoInput{part: "p", push: []string{id}}, Output: fifoOutput{dup: []bool{true}}, Call: call, Return: ret}
	}
	pushUnknown := func(call int64, ids ...string) porcupine.Operation {
		return porcupine.Operation{Input: fifoInput{part: "p", push: ids}, Output: fifoOutput{unknown: true}, Call: call, Return: never}
	}
	pop := func(call, ret int64, batch int, got ...string) porcupine.Operation {
		return porcupine.Operation{Input: fifoInput{part: "p", batch: batch}, Output: fifoOutput{got: got}, Call: call, Return: ret}
	}
	popUnknown := func(call int64, batch int) porcupine.Operation {
		return porcupine.Operation{Input: fifoInput{part: "p", batch: batch}, Output: fifoOutput{unknown: true}, Call: call, Return: never}
	}
	cases := []struct {
		name string
		ok   bool
		ops  []porcupine.Operation
	}{
		{"push pop empty", true, []porcupine.Operation{push(0, 1, "a"), pop(2, 3, 1, "a"), pop(4, 5, 1)}},
		{"fifo order", true, []porcupine.Operation{push(0, 1, "a"), push(2, 3, "b"), pop(4, 5, 2, "a", "b")}},
		{"atomic push of two", true, []porcupine.Operation{push(0, 1, "a", "b"), pop(2, 3, 1, "a"), pop(4, 5, 1, "b"), pop(6, 7, 1)}},
		{"concurrent pushes either order", true, []porcupine.Operation{push(0, 5, "a"), push(1, 4, "b"), pop(6, 7, 2, "b", "a")}},
		{"short batch means empty", true, []porcupine.Operation{push(0, 1, "a"), pop(2, 3, 2, "a"), pop(4, 5, 1)}},
		{"unknown push applied late", true, []porcupine.Operation{pushUnknown(0, "a"), pop(2, 3, 1), pop(4, 5, 1, "a")}},
		{"unknown push never applied", true, []porcupine.Operation{pushUnknown(0, "a"), push(2, 3, "b"), pop(4, 5, 2, "b")}},
		{"retry of an applied push is a duplicate", true, []porcupine.Operation{pushUnknown(0, "a"), pushDup(2, 3, "a"), pop(4, 5, 2, "a")}},
		{"duplicate after consumption adds nothing", true, []porcupine.Operation{push(0, 1, "a"), pop(2, 3, 1, "a"), pushDup(4, 5, "a"), pop(6, 7, 1)}},
		{"unknown pop took the head", true, []porcupine.Operation{push(0, 1, "a", "b"), popUnknown(2, 1), pop(4, 5, 2, "b")}},
		{"unknown pop took nothing", true, []porcupine.Operation{push(0, 1, "a", "b"), popUnknown(2, 1), pop(4, 5, 2, "a", "b")}},
		{"unknown pop on empty, later push", true, []porcupine.Operation{popUnknown(0, 1), pop(1, 2, 1), push(3, 4, "a"), pop(5, 6, 1, "a")}},

		{"lost message", false, []porcupine.Operation{push(0, 1, "a"), pop(2, 3, 1)}},
		{"an unknown pop takes the head, not another", false, []porcupine.Operation{push(0, 1, "a", "b"), popUnknown(2, 1), pop(4, 5, 2, "a")}},
		{"reordered", false, []porcupine.Operation{push(0, 1, "a"), push(2, 3, "b"), pop(4, 5, 1, "b")}},
		{"delivered twice", false, []porcupine.Operation{push(0, 1, "a"), pop(2, 3, 1, "a"), pop(4, 5, 1, "a")}},
		{"never pushed", false, []porcupine.Operation{push(0, 1, "a"), pop(2, 3, 1, "x")}},
		{"short batch with more there", false, []porcupine.Operation{push(0, 1, "a", "b"), pop(2, 3, 5, "a")}},
		{"queued twice", false, []porcupine.Operation{push(0, 1, "a"), push(2, 3, "a")}},
		{"stale empty read", false, []porcupine.Operation{push(0, 1, "a"), pop(2, 3, 1), pop(4, 5, 1, "a")}},
	}
	for _, c := range cases {
		res := porcupine.CheckOperationsTimeout(fifoModelFor(c.ops), c.ops, 10*time.Second)
		if (res == porcupine.Ok) != c.ok {
			t.Errorf("%s: porcupine says %s, want linearizable=%v", c.name, res, c.ok)
		}
	}
}
