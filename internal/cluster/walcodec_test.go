package cluster

import (
	"bytes"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
)

func randomRecords(rng *rand.Rand, first uint64, n int) []*walRecord {
	out := make([]*walRecord, n)
	for i := range out {
		l := &walRecord{Index: first + uint64(i), Term: rng.Uint64N(1 << uint(rng.IntN(63))), Type: walCommand}
		l.Data = make([]byte, rng.IntN(200<<10))
		for j := range l.Data {
			l.Data[j] = byte(rng.Uint32())
		}
		if rng.IntN(4) == 0 {
			l.Extensions = []byte{byte(1 + rng.IntN(3))}
		}
		switch rng.IntN(3) {
		case 0:
			l.AppendedAt = time.Unix(rng.Int64N(1<<40), rng.Int64N(1e9))
		case 1:
			l.AppendedAt = time.Unix(rng.Int64N(1<<40), 0).In(time.FixedZone("odd", 5*3600+30*60+17))
		}
		out[i] = l
	}
	return out
}

// walCodec writes BinaryCodec's bytes, into its kept buffer or not, and
// declares BinaryCodec's id once raft-wal has checked it.
func TestWALCodecWritesBinaryCodecBytes(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	var c walCodec
	if c.ID() < raftwal.FirstExternalCodecID {
		t.Fatalf("before raft-wal's check the codec answers id %d, which raft-wal refuses", c.ID())
	}
	c.declare()
	if c.ID() != raftwal.CodecBinaryV1 {
		t.Fatalf("declared codec id %d, want BinaryCodec's %d", c.ID(), raftwal.CodecBinaryV1)
	}
	var ref raftwal.BinaryCodec
	for round := range 20 {
		logs := randomRecords(rng, uint64(round*100+1), 1+rng.IntN(8))
		a := c.begin(logs)
		var got [][]byte
		for _, l := range logs {
			var buf bytes.Buffer
			if err := c.Encode(l, &buf); err != nil {
				t.Fatal(err)
			}
			got = append(got, buf.Bytes())
		}
		c.end(a)
		for i, l := range logs {
			var want bytes.Buffer
			if err := ref.Encode(l, &want); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[i], want.Bytes()) {
				t.Fatalf("round %d record %d (%d bytes of data): %d bytes encoded, BinaryCodec's %d", round, i, len(l.Data), len(got[i]), want.Len())
			}
			var back raft.Log
			if err := c.Decode(got[i], &back); err != nil || back.Index != l.Index || back.Term != l.Term || !bytes.Equal(back.Data, l.Data) || !bytes.Equal(back.Extensions, l.Extensions) || !back.AppendedAt.Equal(l.AppendedAt) {
				t.Fatalf("round %d record %d decodes to another record (%v)", round, i, err)
			}
		}
		if a != nil {
			// Records of an append that fits share the kept buffer.
			if len(got) > 1 && &got[1][0] != &a.buf[recordSize(logs[0])] {
				t.Fatalf("round %d: the second record is not in the kept buffer after the first", round)
			}
		}
	}
}

// A data directory written with raft-wal's own codec (every earlier
// version's) opens with walCodec, takes appends, and opens again with
// raft-wal's codec, every record as written.
func TestWALCodecReadsAndWritesEarlierDataDirs(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	dir := t.TempDir()
	const segSize = 256 << 10
	old, err := raftwal.Open(dir, raftwal.WithSegmentSize(segSize))
	if err != nil {
		t.Fatal(err)
	}
	var all []*walRecord
	// tiny is an append that ends a phase: raft-wal rotates a segment that
	// an append sealed in the background, and a log closed before that
	// refuses its next append once reopened ("segment is sealed"); an
	// append after the one that sealed waits for the rotation.
	tiny := func() []*walRecord {
		return []*walRecord{{Index: uint64(len(all) + 1), Term: 1, Type: walCommand, Data: []byte("end of phase")}}
	}
	for range 10 {
		logs := randomRecords(rng, uint64(len(all)+1), 1+rng.IntN(4))
		if err := old.StoreLogs(logs); err != nil {
			t.Fatal(err)
		}
		all = append(all, logs...)
	}
	end := tiny()
	if err := old.StoreLogs(end); err != nil {
		t.Fatal(err)
	}
	all = append(all, end...)
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	check := func(w *raftwal.WAL, who string) {
		t.Helper()
		for _, l := range all {
			var got walRecord
			if err := w.GetLog(l.Index, &got); err != nil {
				t.Fatalf("%s: entry %d: %v", who, l.Index, err)
			}
			if got.Term != l.Term || !bytes.Equal(got.Data, l.Data) || !bytes.Equal(got.Extensions, l.Extensions) || !got.AppendedAt.Equal(l.AppendedAt) {
				t.Fatalf("%s: entry %d differs from what was written", who, l.Index)
			}
		}
	}
	for _, mode := range []FsyncMode{FsyncAlways, FsyncInterval} {
		s := newLogSyncer(mode, 10*time.Second, quietLogger())
		wal, err := s.openWAL(dir, segSize)
		if err != nil {
			t.Fatalf("%s: open a data directory of raft-wal's codec: %v", mode, err)
		}
		check(wal, string(mode)+", the earlier records")
		log := &syncedLog{WAL: wal, s: s}
		for range 10 {
			logs := randomRecords(rng, uint64(len(all)+1), 1+rng.IntN(6))
			if err := log.storeLogs(logs, false); err != nil {
				t.Fatal(err)
			}
			all = append(all, logs...)
		}
		end := tiny()
		if err := log.storeLogs(end, false); err != nil {
			t.Fatal(err)
		}
		all = append(all, end...)
		check(wal, string(mode)+", all")
		if err := s.close(); err != nil {
			t.Fatal(err)
		}
		if err := wal.Close(); err != nil {
			t.Fatal(err)
		}
		back, err := raftwal.Open(dir, raftwal.WithSegmentSize(segSize))
		if err != nil {
			t.Fatalf("%s: raft-wal's codec opening what walCodec wrote: %v", mode, err)
		}
		check(back, string(mode)+", reopened with raft-wal's codec")
		if err := back.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// An append through writeChunks allocates no copy of its entries for the
// records: what it allocates stays well below the entries' bytes, where
// raft-wal's own codec allocates each record anew.
func TestWALAppendAllocatesNoRecordCopies(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := newLogSyncer(FsyncInterval, 10*time.Second, quietLogger())
	wal, err := s.openWAL(t.TempDir(), 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		s.close()
		wal.Close()
	}()
	log := &syncedLog{WAL: wal, s: s}
	const per, size = 8, 100 << 10
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	next := uint64(1)
	batch := func() []*walRecord {
		logs := make([]*walRecord, per)
		for i := range logs {
			logs[i] = &walRecord{Index: next, Term: 1, Type: walCommand, Data: data}
			next++
		}
		return logs
	}
	// The first appends size the kept buffers (the codec's, the segment's).
	for range 3 {
		if err := log.storeLogs(batch(), false); err != nil {
			t.Fatal(err)
		}
	}
	// Process-wide counts: the least of five trials is this code's.
	least := uint64(math.MaxUint64)
	for range 5 {
		logs := batch()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		if err := log.storeLogs(logs, false); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	t.Logf("an append of %d entries of %d KiB allocated %d bytes", per, size>>10, least)
	if least > size {
		t.Fatalf("an append of %d entries of %d bytes allocated %d bytes: a copy of a record", per, size, least)
	}
}
