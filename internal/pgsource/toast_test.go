package pgsource

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/queen-mq/queen/internal/connector"
)

const docsDDL = `CREATE TABLE docs (id int PRIMARY KEY, big text NOT NULL, n int NOT NULL);
ALTER TABLE docs ALTER big SET STORAGE EXTERNAL;
INSERT INTO docs SELECT id, (SELECT string_agg(md5(g::text || id::text), '') FROM generate_series(1, 400) g), 0 FROM generate_series(1, 5) id;`

// TestToastAndKeyChanges: an update during its own snapshot chunk comes
// from the stream (never older after newer) and gets a fill event with
// the TOAST value it left unchanged; a later update lists the value in
// unchanged; a key change is a d then a c whose large value is read back;
// under REPLICA IDENTITY FULL nothing is unchanged and before is the whole
// old row.
func TestToastAndKeyChanges(t *testing.T) {
	s, db := ordersSource(t)
	s.Exec(t, db, docsDDL)
	c := s.Connect(t, db)
	big := func(id int) string {
		var v string
		if err := c.QueryRow(context.Background(), "SELECT big FROM docs WHERE id = $1", id).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	big2, big4 := big(2), big(4)
	b := openBroker(t, "")
	defer b.Close()
	var once atomic.Bool
	h := &hooks{afterLow: func(string) {
		if once.CompareAndSwap(false, true) {
			s.Exec(t, db, "UPDATE docs SET n = 1 WHERE id = 2")
		}
	}}
	src := startSource(t, b, sourceDoc(s, db, "toast", connector.TableSpec{Table: "public.docs", Queue: "docs"}), "n1", h)
	src.waitPhase(t, connector.PhaseStreaming)
	evs := drain(t, b, "docs", "g", 6)
	byPart := map[string][]got{}
	for _, g := range evs {
		byPart[g.msg.Partition] = append(byPart[g.msg.Partition], g)
	}
	two := byPart["2"]
	if len(two) != 2 || two[0].ev.Op != "u" || two[1].ev.Op != "u" {
		t.Fatalf("key 2: %d events, want the update and its fill: %v", len(two), two)
	}
	if string(two[0].ev.After["n"]) != "1" || strings.Join(two[0].ev.Unchanged, ",") != "big" || two[0].ev.After["big"] != nil {
		t.Fatalf("the update during the chunk: %s", two[0].msg.Data)
	}
	var fillBig string
	if err := json.Unmarshal(two[1].ev.After["big"], &fillBig); err != nil || fillBig != big2 {
		t.Fatalf("the fill does not carry the TOAST value: %s", two[1].msg.Data)
	}
	if strings.Join(two[1].ev.Unchanged, ",") != "n" || !strings.Contains(two[1].msg.TxID, ":s:") || !strings.HasSuffix(two[1].msg.TxID, ":f1") {
		t.Fatalf("fill event %s %s", two[1].msg.TxID, two[1].msg.Data)
	}
	for _, k := range []string{"1", "3", "4", "5"} {
		if l := byPart[k]; len(l) != 1 || l[0].ev.Op != "r" {
			t.Fatalf("key %s: %v", k, l)
		}
	}

	s.Exec(t, db, "UPDATE docs SET n = 2 WHERE id = 3")
	s.Exec(t, db, "UPDATE docs SET id = 40, n = 3 WHERE id = 4")
	s.Exec(t, db, "ALTER TABLE docs REPLICA IDENTITY FULL; UPDATE docs SET n = 4 WHERE id = 5")
	evs = drain(t, b, "docs", "g", 4)
	byPart = map[string][]got{}
	for _, g := range evs {
		byPart[g.msg.Partition] = append(byPart[g.msg.Partition], g)
	}
	if u := byPart["3"]; len(u) != 1 || u[0].ev.Op != "u" || strings.Join(u[0].ev.Unchanged, ",") != "big" {
		t.Fatalf("TOAST update: %v", u)
	}
	d, cr := byPart["4"], byPart["40"]
	if len(d) != 1 || d[0].ev.Op != "d" || string(d[0].raw["before"]) != `{"id":4}` || string(d[0].raw["key"]) != `{"id":4}` {
		t.Fatalf("key change's d: %v", d)
	}
	if len(cr) != 1 || cr[0].ev.Op != "c" || cr[0].ev.Unchanged != nil || !strings.HasSuffix(cr[0].msg.TxID, ".1") {
		t.Fatalf("key change's c: %v", cr)
	}
	var got40 string
	if err := json.Unmarshal(cr[0].ev.After["big"], &got40); err != nil || got40 != big4 {
		t.Fatal("the key change's c lacks the large value read back")
	}
	if strings.TrimSuffix(cr[0].msg.TxID, ".1") != d[0].msg.TxID {
		t.Fatalf("ids %s and %s", d[0].msg.TxID, cr[0].msg.TxID)
	}
	full := byPart["5"]
	if len(full) != 1 || full[0].ev.Unchanged != nil || full[0].ev.After["big"] == nil || string(full[0].ev.Before["n"]) != "0" || full[0].ev.Before["big"] == nil {
		t.Fatalf("REPLICA IDENTITY FULL update: %v", full)
	}
}
