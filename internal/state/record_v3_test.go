package state

import (
	"math"
	"math/rand"
	"reflect"
	"testing"
)

// appendPartV2 is the version 2 encoding as builds before version 3 wrote it.
func appendPartV2(p *partRec) []byte {
	e := enc{}
	e.u8(2)
	p.appendFixed(&e)
	e.str(p.FirstTx)
	return e.b
}

// TestPartRecordV3: a record with a first id is written as version 3 and
// reads back field for field, whatever the values (a tail before the
// creation, extremes); version 2 records, as older builds wrote them, still
// read; a truncated or padded version 3 record is refused, not misread.
func TestPartRecordV3(t *testing.T) {
	seed := rand.Int63()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	fields := func(p *partRec) partRec {
		return partRec{Queue: p.Queue, First: p.First, Next: p.Next, CreatedAt: p.CreatedAt, CreatedIdx: p.CreatedIdx,
			LastTime: p.LastTime, LastIdx: p.LastIdx, Gen: p.Gen, GenStart: p.GenStart, Bucket: p.Bucket, Name: p.Name, FirstTx: p.FirstTx}
	}
	pick := func() uint64 {
		switch rng.Intn(4) {
		case 0:
			return 0
		case 1:
			return math.MaxUint64 - uint64(rng.Intn(3))
		default:
			return rng.Uint64() >> uint(rng.Intn(64))
		}
	}
	recs := []*partRec{{Queue: 1, Name: "a", FirstTx: "tx", CreatedAt: 1_800_000_000_000_000, CreatedIdx: 90_000, LastTime: 1_800_000_000_000_000, LastIdx: 90_000, Gen: 1, Next: 1}}
	for i := 0; i < 2000; i++ {
		recs = append(recs, &partRec{Queue: pick(), First: pick(), Next: pick(), CreatedAt: int64(pick()), CreatedIdx: pick(),
			LastTime: int64(pick()), LastIdx: pick(), Gen: uint32(pick()), GenStart: pick(), Bucket: int64(pick()),
			Name: string(rune('a' + rng.Intn(26))), FirstTx: "pg:0:s:" + string(rune('a'+rng.Intn(26)))})
	}
	for _, p := range recs {
		p.markTail()
		b := p.encode()
		if b[0] != 3 {
			t.Fatalf("a record with a first id is version %d, want 3", b[0])
		}
		d, err := decodePart(b)
		if err != nil || !reflect.DeepEqual(fields(d), fields(p)) {
			t.Fatalf("record %+v does not round-trip: %+v, %v", fields(p), d, err)
		}
		d, err = decodePart(appendPartV2(p))
		if err != nil || !reflect.DeepEqual(fields(d), fields(p)) {
			t.Fatalf("version 2 of %+v reads as %+v, %v", fields(p), d, err)
		}
		for n := 1; n < len(b); n++ {
			if _, err := decodePart(b[:n]); err == nil {
				t.Fatalf("a version 3 record cut to %d of %d bytes decoded", n, len(b))
			}
		}
		if _, err := decodePart(append(b, 0)); err == nil {
			t.Fatal("a version 3 record with a byte after it decoded")
		}
	}
	small := recs[0].encode()
	if old := appendPartV2(recs[0]); len(small) >= len(old)*2/3 {
		t.Fatalf("a new partition's record is %d bytes as version 3, %d as version 2", len(small), len(old))
	}
}
