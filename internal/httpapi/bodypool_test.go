package httpapi

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime"
	"testing"
)

// TestPushBodyBuffersAreReused: once a push body's buffer is handed back,
// the next body of a like size is read into it instead of a new one: a
// hundred reads of 100 KiB bodies allocate far less than one body each
// (each read allocating its own was 100 × 100 KiB). Each body reads back
// exactly as sent, though the buffer held the one before.
func TestPushBodyBuffersAreReused(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	s := New(authzBroker(t), Config{})
	const rounds = 100
	bodies := make([][]byte, 2)
	for i := range bodies {
		bodies[i] = make([]byte, 100<<10-r.IntN(1000))
		for j := range bodies[i] {
			bodies[i][j] = 'a' + byte(r.IntN(26))
		}
	}
	read := func(want []byte) []byte {
		req, err := http.NewRequest(http.MethodPost, "/api/v1/push", io.NopCloser(bytes.NewReader(want)))
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = int64(len(want))
		got, e := s.readBodyBytes(req)
		if e != nil {
			t.Fatal(e)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("read %d bytes, not the %d sent", len(got), len(want))
		}
		return got
	}
	releaseBody(read(bodies[0]))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range rounds {
		releaseBody(read(bodies[i%2]))
	}
	runtime.ReadMemStats(&after)
	// A collection in between may empty the pool, and under the race
	// detector sync.Pool drops a quarter of what it is given: a few new
	// buffers are fine, one per read is not.
	most := uint64(rounds * len(bodies[0]) / 4)
	if raceDetector {
		most *= 2
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > most {
		t.Fatalf("%d reads of 100 KiB bodies allocated %d bytes, want at most %d: the buffers are not reused", rounds, got, most)
	}
}

// TestBodyClass: sizes outside the pooled range are not pooled, and a
// buffer of a class holds every size the class covers.
func TestBodyClass(t *testing.T) {
	for _, n := range []int64{0, 1, bodyPoolMin - 1, bodyPoolMax + 1, 64 << 20} {
		if c, _ := bodyClass(n); c >= 0 {
			t.Errorf("bodyClass(%d) = %d, want -1 (not pooled)", n, c)
		}
	}
	for n := int64(bodyPoolMin); n <= bodyPoolMax; n += 997 {
		c, size := bodyClass(n)
		if c < 0 || c >= len(bodyPools) || int64(size) < n || int64(size)-n >= bodyPoolStep {
			t.Fatalf("bodyClass(%d) = %d, %d: want a pool whose buffers hold it with less than %d spare", n, c, size, bodyPoolStep)
		}
		if c2, size2 := bodyClass(int64(size)); c2 != c || size2 != size {
			t.Fatalf("a buffer of %d (class %d) is classed %d, %d when handed back", size, c, c2, size2)
		}
	}
}
