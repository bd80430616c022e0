package pgsink

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/connector"
)

// randomValue is a JSON value, valid or not, of the kinds the COPY path
// has rules for: strings with escapes, unicode, control characters and
// bad UTF-8, numbers PostgreSQL keeps or normalises, literals, nested
// objects and arrays.
func randomValue(r *rand.Rand, depth int) string {
	if depth < 0 { // the common message's: strings, numbers, literals
		switch r.IntN(4) {
		case 0:
			return []string{"1", "-2", "12.50", "0", "true", "null"}[r.IntN(6)]
		case 1:
			return `"plain ascii value"`
		}
		return randomString(r)
	}
	switch k := r.IntN(14); {
	case k < 5:
		return randomString(r)
	case k < 8:
		nums := []string{"0", "7", "-3", "12.50", "0.0", "123456789012345678901234567890", "3.14159", "-0.5", "100"}
		if r.IntN(5) == 0 {
			nums = []string{"-0", "-0.0", "1e3", "2E-2", "01", "1.", ".5", "-", strings.Repeat("9", 101)}
		}
		return nums[r.IntN(len(nums))]
	case k < 10:
		lits := []string{"true", "false", "null", "nul", "tru", "nullx"}
		return lits[r.IntN(len(lits))]
	case depth >= 3:
		return "null"
	case k < 12:
		n := r.IntN(4)
		parts := make([]string, n)
		for i := range parts {
			parts[i] = randomValue(r, depth+1)
		}
		return "[" + strings.Join(parts, ws(r)+","+ws(r)) + "]"
	default:
		n := r.IntN(4)
		parts := make([]string, n)
		for i := range parts {
			parts[i] = randomString(r) + ws(r) + ":" + ws(r) + randomValue(r, depth+1)
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
}

func randomString(r *rand.Rand) string {
	good := []string{"a", "Z", "9", " ", "customer-000042", `\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`, `\u0041`, `\u00e9`,
		`\u0001`, `\u001f`, `\ud83d\ude00`, "é", "✓", "😀", "\x7f"}
	bad := []string{`\u0000`, `\ud800`, `\udc00x`, `\uZZZZ`, `\x`, "\t", "\x01", "\xff", "\xc3", "\\"}
	pieces := good
	if r.IntN(12) == 0 {
		pieces = append(slices.Clip(good), bad...)
	}
	var sb strings.Builder
	sb.WriteByte('"')
	for n := r.IntN(8); n > 0; n-- {
		if r.IntN(3) == 0 {
			sb.WriteString(strings.Repeat("x", r.IntN(40)))
		}
		sb.WriteString(pieces[r.IntN(len(pieces))])
	}
	if r.IntN(50) != 0 {
		sb.WriteByte('"')
	}
	return sb.String()
}

func ws(r *rand.Rand) string {
	if r.IntN(8) == 0 {
		return []string{" ", "\n", "\t ", "\r\n"}[r.IntN(4)]
	}
	return ""
}

// randomLayout is a message's keys in order: columns of every conversion,
// a key that is no column, an escaped key, repeats, or none.
func randomLayout(r *rand.Rand) []string {
	keys := []string{`"id"`, `"t"`, `"n"`, `"j"`, `"jb"`, `"b"`, `"zz"`, `"t\u0041"`, `"id"`}
	n := r.IntN(7)
	out := make([]string, 0, n)
	for _, i := range r.Perm(len(keys))[:n] {
		out = append(out, keys[i])
	}
	return out
}

func randomMessage(r *rand.Rand, layout []string, clean bool) string {
	depth, ws := 0, ws
	if clean {
		depth = -1
		if r.IntN(4) != 0 { // compact, as most producers write
			ws = func(*rand.Rand) string { return "" }
		}
	}
	if r.IntN(60) == 0 {
		return []string{`[1]`, `"s"`, `{}`, ``, `{"id":1`, `{"id":1,}`, `{"id":1} x`}[r.IntN(7)]
	}
	var sb strings.Builder
	sb.WriteString(ws(r) + "{")
	for i, k := range layout {
		if i > 0 {
			sb.WriteString(ws(r) + "," + ws(r))
		}
		sb.WriteString(k + ws(r) + ":" + ws(r) + randomValue(r, depth))
	}
	sb.WriteString("}" + ws(r))
	return sb.String()
}

// TestDecodeRandomAgrees decodes random batches the way a worker does (the
// batch's scratch and arena, in partition order) and checks every message
// against the general path alone: a message the fast path takes gets the
// op, key and COPY line the general path gives it, one it leaves gets
// what the general path gives (or the same refusal), and a run's COPY data
// sent from the arena is its lines, each with its newline.
func TestDecodeRandomAgrees(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	cp := &copyPlan{conv: map[string]conv{"id": convText, "t": convText, "n": convText, "j": convJSON, "jb": convJSONB, "b": convText, "tA": convText}}
	fastTaken, total, borrowed := 0, 0, 0
	for _, mode := range []string{"append", "upsert"} {
		for batch := 0; batch < 500; batch++ {
			s := &sink{spec: connector.SinkSpec{Mode: mode}}
			p := &plan{writable: map[string]bool{}, key: []string{"id"}, copy: cp}
			for c := range cp.conv {
				p.writable[c] = true
			}
			w := &worker{s: s, plan: p}
			// Runs of one layout, as a producer writes them, sometimes
			// broken by another.
			var msgs []broker.Delivery
			layout, clean := randomLayout(r), batch%2 == 0
			for i := 0; i < 1+r.IntN(60); i++ {
				if r.IntN(10) == 0 {
					layout = randomLayout(r)
				}
				pid := uint64(1 + r.IntN(4))
				msgs = append(msgs, broker.Delivery{PartitionID: pid, Partition: fmt.Sprint(pid), Offset: uint64(i), Payload: []byte(randomMessage(r, layout, clean))})
			}
			if r.IntN(2) == 0 {
				slices.SortStableFunc(msgs, func(a, b broker.Delivery) int { return int(a.PartitionID) - int(b.PartitionID) })
			}
			items, parts := w.group(msgs)
			if err := w.decode(context.Background(), items, parts); err != nil {
				t.Fatalf("seed %d: decode: %v", seed, err)
			}
			for _, it := range items {
				total++
				m := *it.m
				want, werr := s.decode(&plan{writable: p.writable, key: p.key, copy: cp}, &m)
				if fo, ok := s.fastRowOp(p, &m, nil); ok {
					fastTaken++
					g, gerr := s.rowOp(p, &m, m.Payload, nil)
					if gerr != nil || g.kind != fo.kind || !slices.Equal(g.cols, fo.cols) || g.colKey != fo.colKey || g.key != fo.key ||
						string(g.doc) != string(fo.doc) || string(g.copy) != string(fo.copy) {
						t.Fatalf("seed %d, %s %q:\n fast    %s\n general %s (%v)", seed, mode, m.Payload, opString(fo), opString(g), gerr)
					}
				}
				if (werr != nil) != (it.decErr != nil) || (werr != nil && werr.Error() != it.decErr.Error()) {
					t.Fatalf("seed %d, %s %q: batch error %v, alone %v", seed, mode, m.Payload, it.decErr, werr)
				}
				if werr != nil {
					continue
				}
				if len(want) != len(it.ops) {
					t.Fatalf("seed %d, %s %q: %d ops, alone %d", seed, mode, m.Payload, len(it.ops), len(want))
				}
				for j := range want {
					g, o := it.ops[j], want[j]
					if g.kind != o.kind || !slices.Equal(g.cols, o.cols) || g.colKey != o.colKey || g.key != o.key ||
						string(g.doc) != string(o.doc) || string(g.copy) != string(o.copy) || (g.copy == nil) != (o.copy == nil) {
						t.Fatalf("seed %d, %s %q:\n in the batch %s\n alone        %s", seed, mode, m.Payload, opString(g), opString(o))
					}
				}
			}
			// Every COPY run's data, from the arena or copied, is its lines.
			todo, err := w.classify(context.Background(), &result{items: items}, parts)
			if err != nil {
				t.Fatal(err)
			}
			for _, run := range runs(todo) {
				if run[0].copy == nil {
					continue
				}
				var want []byte
				for _, o := range run {
					want = append(append(want, o.copy...), '\n')
				}
				st := w.newCopyStep()
				w.appendCopyRun(st, run)
				if !bytes.Equal(st.data, want) {
					t.Fatalf("seed %d: COPY data %q, want %q", seed, st.data, want)
				}
				if st.borrowed {
					borrowed++
					if cap(st.data) != len(st.data) {
						t.Fatalf("seed %d: borrowed data has room after it", seed)
					}
				} else {
					w.copyBuf = st.data[:0]
				}
			}
		}
	}
	t.Logf("%d messages, %d on the fast path, %d runs sent from the arena", total, fastTaken, borrowed)
	if fastTaken < total/8 || borrowed == 0 {
		t.Fatalf("seed %d: the fast path took %d of %d messages, %d runs borrowed: the generator misses it", seed, fastTaken, total, borrowed)
	}
}

func opString(o op) string {
	return fmt.Sprintf("kind %d cols %q key %q copy %q (nil %v) doc %q", o.kind, o.cols, o.key, o.copy, o.copy == nil, o.doc)
}
