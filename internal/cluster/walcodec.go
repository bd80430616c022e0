package cluster

import (
	"bytes"
	"encoding/binary"
	"io"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
)

// walCodec is raft-wal's BinaryCodec, whose bytes it writes (it calls it),
// except that the records of an append made through syncedLog.writeChunks
// are encoded into one buffer the codec keeps, not each into a new one:
// raft-wal's StoreLogs encodes every record into a bytes.Buffer of its own
// and its segment writer copies the record into the segment's write
// buffer, after which the record's bytes are garbage, the size of the
// entry each. The kept buffer is free again once StoreLogs has returned
// (the segment writer has copied every record by then, and keeps none).
//
// Since the bytes are BinaryCodec's, the codec declares BinaryCodec's id
// (CodecBinaryV1), which every segment of a data directory carries: the
// data directories of earlier versions open unchanged, and an earlier
// version opens this one's. raft-wal refuses an external codec with an id
// below FirstExternalCodecID when it opens the log, before it reads its
// metadata; the codec answers with FirstExternalCodecID until then
// (declare, called from the metadata store's Load) and with
// CodecBinaryV1 for every segment.
type walCodec struct {
	raftwal.BinaryCodec
	declared atomic.Bool
	// mu makes an append the only one using buf (begin to end); cur is
	// that append while it runs.
	mu  sync.Mutex
	buf []byte
	cur atomic.Pointer[walArena]
}

// walArena is the kept buffer lent to one StoreLogs call: the records of
// logs, in order, each into the next free part of buf.
type walArena struct {
	logs []*walRecord
	next int
	buf  []byte
	off  int
}

// maxCodecBuf bounds the buffer the codec keeps between appends: an append
// holds at most maxWALWrite bytes of entries, or one larger entry, which
// is encoded the ordinary way.
const maxCodecBuf = maxWALWrite + maxWALWrite/4

func (c *walCodec) ID() uint64 {
	if !c.declared.Load() {
		return raftwal.FirstExternalCodecID
	}
	return raftwal.CodecBinaryV1
}

// declare has ID answer CodecBinaryV1 from now on (raft-wal has checked
// the codec and is about to read the log's metadata).
func (c *walCodec) declare() { c.declared.Store(true) }

// recordSize is at least the length of l's BinaryCodec encoding.
func recordSize(l *walRecord) int {
	n := uvarintLen(l.Index) + uvarintLen(l.Term) + uvarintLen(uint64(l.Type))
	n += uvarintLen(uint64(len(l.Data))) + len(l.Data)
	n += uvarintLen(uint64(len(l.Extensions))) + len(l.Extensions)
	return n + 16 // time.Time's MarshalBinary: 15 bytes, 16 with a zone's seconds
}

func uvarintLen(v uint64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], v)
}

// begin lends the kept buffer to the StoreLogs call that appends logs
// (nil when they do not fit it: they are encoded the ordinary way). end
// takes it back once that call has returned.
func (c *walCodec) begin(logs []*walRecord) *walArena {
	size := 0
	for _, l := range logs {
		size += recordSize(l)
	}
	if size > maxCodecBuf {
		return nil
	}
	c.mu.Lock()
	if cap(c.buf) < size {
		c.buf = make([]byte, size)
	}
	a := &walArena{logs: logs, buf: c.buf[:cap(c.buf)]}
	c.cur.Store(a)
	return a
}

func (c *walCodec) end(a *walArena) {
	if c == nil || a == nil {
		return
	}
	c.cur.Store(nil)
	c.mu.Unlock()
}

// Encode writes l's BinaryCodec encoding to w. When w is the empty buffer
// StoreLogs gives each record and l is the next record of the append the
// kept buffer is lent to, the buffer's next part becomes w's storage, of
// the record's size, so writing it allocates nothing.
func (c *walCodec) Encode(l *raft.Log, w io.Writer) error {
	if b, ok := w.(*bytes.Buffer); ok && b.Cap() == 0 {
		if a := c.cur.Load(); a != nil && a.next < len(a.logs) && a.logs[a.next] == l {
			a.next++
			n := recordSize(l)
			if len(a.buf)-a.off >= n {
				*b = *bytes.NewBuffer(a.buf[a.off : a.off : a.off+n])
				a.off += n
			}
		}
	}
	return c.BinaryCodec.Encode(l, w)
}
