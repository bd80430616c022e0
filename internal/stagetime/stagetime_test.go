package stagetime

import (
	"context"
	"testing"
)

// Off, the hooks record nothing and a nil trace or entry takes every call.
func TestOffRecordsNothing(t *testing.T) {
	Disable()
	if tr := Begin("push"); tr != nil {
		t.Fatal("Begin returned a trace with timing off")
	}
	var tr *Trace
	tr.Mark(Decoded)
	tr.Finish()
	if got := From(With(context.Background(), tr)); got != nil {
		t.Fatalf("From gave %v with timing off", got)
	}
	if e := NewEntry([]*Trace{tr}); e != nil {
		t.Fatal("NewEntry returned an entry with timing off")
	}
	var e *Entry
	e.Mark(Encode)
	e.Register(1)
}

// A stage's CPU time is reported only when both stamps come from one thread.
func TestSpanNeedsOneThread(t *testing.T) {
	a := Stamp{Wall: 100, CPU: 10, TID: 7}
	b := Stamp{Wall: 300, CPU: 60, TID: 7}
	w, c, ok := Span(a, b)
	if w != 200 || c != 50 || !ok {
		t.Fatalf("same thread: wall %v cpu %v ok %v, want 200ns 50ns true", w, c, ok)
	}
	b.TID = 8
	if w, _, ok := Span(a, b); w != 200 || ok {
		t.Fatalf("two threads: wall %v ok %v, want 200ns false", w, ok)
	}
	if _, _, ok := Span(Stamp{Wall: 1, CPU: -1, TID: 7}, Stamp{Wall: 2, CPU: 5, TID: 7}); ok {
		t.Fatal("an unknown CPU clock gave a CPU time")
	}
}

// On, a request's trace reaches the sink with its entry, which the
// leader's log write finds by key, a follower's by index, and the apply
// by key again.
func TestEntryFollowsTheLog(t *testing.T) {
	var got []*Trace
	Enable(func(tr *Trace) { got = append(got, tr) })
	defer Disable()
	tr := Begin("push")
	ctx := With(context.Background(), tr)
	From(ctx).Mark(Validated)
	e := NewEntry([]*Trace{From(ctx)})
	e.Mark(Encode)
	e.Register(42)
	e.Mark(Handed)
	Stored(true, "leader", []LogRef{{Index: 9, Key: 42}}, Now(), Now())
	Stored(false, "f1", []LogRef{{Index: 9, Key: 77}}, Now(), Now())
	Stored(false, "f2", []LogRef{{Index: 10, Key: 78}}, Now(), Now())
	Applied([]LogRef{{Index: 9, Key: 42}}, Now(), Now())
	e.Mark(Returned)
	tr.Mark(Result)
	tr.Finish()
	if len(got) != 1 || got[0] != tr || tr.Entry != e {
		t.Fatalf("sink got %v, want the one trace with its entry", got)
	}
	v := e.View()
	if v.Index != 9 || v.Cmds != 1 || v.Batch != 1 || len(v.Followers) != 1 || v.Followers[0].Node != "f1" {
		t.Fatalf("entry view %+v: want index 9, 1 command, batch 1, follower f1 only", v)
	}
	for m := Encode; m < NumEntryMarks; m++ {
		if !v.At[m].Set() {
			t.Fatalf("entry mark %d not set", m)
		}
	}
	for m := Start; m < NumMarks; m++ {
		if m != Decoded && m != Queued && m != Woken && !tr.At[m].Set() {
			t.Fatalf("request mark %d not set", m)
		}
	}
	stores, applies := Intervals()
	if len(stores) != 1 || len(applies) != 1 {
		t.Fatalf("%d leader writes and %d applies recorded, want 1 and 1 (followers' writes are not the leader's)", len(stores), len(applies))
	}
}
