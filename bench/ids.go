package main

import (
	"encoding/hex"
	"math/rand/v2"
	"time"
)

// idGen makes UUIDv7 strings, as Queen's client libraries do for every
// pushed item: 48 bits of Unix milliseconds, a 12-bit sequence that keeps
// one generator's ids increasing within a millisecond, then random bits.
// Not safe for concurrent use: each producer has its own.
type idGen struct {
	lastMS int64
	seq    uint16
	rnd    *rand.Rand
}

func newIDGen(seed uint64) *idGen {
	return &idGen{rnd: rand.New(rand.NewPCG(seed, uint64(time.Now().UnixNano())))}
}

func (g *idGen) next() string {
	ms := time.Now().UnixMilli()
	if ms <= g.lastMS {
		if g.seq++; g.seq >= 1<<12 {
			g.lastMS++ // borrow the next millisecond
			g.seq = 0
		}
		ms = g.lastMS
	} else {
		g.lastMS, g.seq = ms, uint16(g.rnd.UintN(1<<10))
	}
	var b [16]byte
	for i := 0; i < 6; i++ {
		b[i] = byte(ms >> (40 - 8*i))
	}
	b[6] = 0x70 | byte(g.seq>>8)
	b[7] = byte(g.seq)
	r := g.rnd.Uint64()
	for i := 8; i < 16; i++ {
		b[i] = byte(r >> (8 * (i - 8)))
	}
	b[8] = 0x80 | b[8]&0x3f
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], b[10:16])
	return string(s[:])
}
