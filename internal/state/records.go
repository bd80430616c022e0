package state

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"

	"github.com/cockroachdb/pebble/v2"
)

// meta is the single record of counters and the applied position.
type meta struct {
	Applied    uint64 `json:"applied"`
	LastTime   int64  `json:"lastTime"` // µs since epoch, never decreases
	NextTenant uint32 `json:"nextTenant"`
	NextQueue  uint64 `json:"nextQueue"`
	NextPart   uint64 `json:"nextPart"`
	NextSub    uint64 `json:"nextSub"`
	NextDLQ    uint64 `json:"nextDlq"`
}

// QueueOptions are a queue's settings. The named fields have effects; Extra
// keeps Queen's other options so they are stored and echoed.
type QueueOptions struct {
	LeaseTime                 int64                      `json:"leaseTime"`
	RetryLimit                int64                      `json:"retryLimit"`
	RetryDelay                int64                      `json:"retryDelay"`
	DelayedProcessing         int64                      `json:"delayedProcessing"`
	WindowBuffer              int64                      `json:"windowBuffer"`
	MaxSize                   int64                      `json:"maxSize"`
	RetentionSeconds          int64                      `json:"retentionSeconds"`
	RetentionMessages         int64                      `json:"retentionMessages"`
	CompletedRetentionSeconds int64                      `json:"completedRetentionSeconds"`
	MaxWaitTimeSeconds        int64                      `json:"maxWaitTimeSeconds,omitempty"`
	EncryptionEnabled         bool                       `json:"encryptionEnabled"`
	Extra                     map[string]json.RawMessage `json:"extra,omitempty"`
}

// DefaultQueueOptions are the options of a queue created by its first push.
func DefaultQueueOptions() QueueOptions {
	return QueueOptions{LeaseTime: 300, RetryLimit: 3}
}

// queueRec is the stored queue record.
type queueRec struct {
	ID         uint64       `json:"id"`
	Name       string       `json:"name"`
	Namespace  string       `json:"namespace,omitempty"`
	Task       string       `json:"task,omitempty"`
	CreatedAt  int64        `json:"createdAt"`
	Options    QueueOptions `json:"options"`
	Total      int64        `json:"total"`      // retained messages
	Pushed     int64        `json:"pushed"`     // messages ever pushed
	Partitions int64        `json:"partitions"` // partitions created
	Deleted    int64        `json:"deleted"`    // messages removed by retention
}

// partRec is the stored partition record.
type partRec struct {
	Queue      uint64
	First      uint64 // first retained offset
	Next       uint64 // next offset to assign
	CreatedAt  int64
	CreatedIdx uint64
	LastTime   int64  // createdAt of the newest message
	LastIdx    uint64 // log index of the newest message
	Gen        uint32 // current dedup generation
	GenStart   uint64 // first offset of the current generation
	Bucket     int64  // start of the last retention bucket indexed
	Name       string
	// FirstTx is the transaction id of the partition's first message
	// (offset 0, generation 1) when the push that created the partition
	// wrote no dedup key for it: the record stands for that key
	// (dedupLookup). Empty for partitions created before it existed.
	FirstTx string

	// The tail as of the last change of another field (see markTail):
	// what the stored record holds.
	storedNext     uint64
	storedLastTime int64
	storedLastIdx  uint64

	// floors hold, for the generations a dedup lookup reads, a lower bound
	// of the partition's dedup keys (see dedupFloor); nil until a lookup
	// needs one (most new partitions never do). Memory only: they spare
	// reads, never change a result.
	floors *[2]dedupFloor
	// born is the serial of the batch that created the partition (0 for
	// a record read from Pebble). Memory only.
	born uint64
	// tid is the partition's tenant (the record cache is keyed by
	// partition id alone). Memory only.
	tid uint32
	// uncursored: created by the running push, which has not yet looked
	// at its cursors (there are none, cached or stored). noCursor: no
	// cursor record of it exists, because this store created it and has
	// written none of its cursors since (markCursor), so a cursor missing
	// from the cache is derived without a read. Memory only.
	uncursored, noCursor bool
}

// dedupFloor bounds the dedup keys of one generation of a partition from
// below: min is at most the suffix (the inverted id bytes) of every stored
// key of that generation, and empty means there is none. An id whose suffix
// sorts before min cannot be stored, so it needs no read. Client ids are
// mostly UUIDv7s, increasing with time, whose suffixes decrease: a new id
// sorts first and is decided by one comparison.
//
// The bound stays true because dedup keys are only ever added by a push,
// which lowers it (noteDedup), or removed, which can only raise the true
// minimum. A record loaded from Pebble starts with none known.
type dedupFloor struct {
	gen   uint32 // 0: nothing known
	empty bool
	min   string
}

// floor returns the known floor of generation g, or nil.
func (p *partRec) floor(g uint32) *dedupFloor {
	if p.floors == nil {
		return nil
	}
	for i := range p.floors {
		if f := &p.floors[i]; f.gen == g && g != 0 {
			return f
		}
	}
	return nil
}

// setFloor records the floor of generation g, replacing the oldest one.
func (p *partRec) setFloor(g uint32, empty bool, min string) {
	if p.floors == nil {
		p.floors = new([2]dedupFloor)
	}
	i := 0
	if p.floors[1].gen < p.floors[0].gen {
		i = 1
	}
	p.floors[i] = dedupFloor{gen: g, empty: empty, min: min}
}

// noteDedup lowers generation g's floor, if known, for a key being added.
func (p *partRec) noteDedup(g uint32, suffix []byte) {
	if f := p.floor(g); f != nil && (f.empty || string(suffix) < f.min) {
		f.empty, f.min = false, string(suffix)
	}
}

// markTail takes the current tail as the one to store. It is called with
// every change of a field other than the tail, so the stored record is the
// state as of that command, whichever entries a batch held: replicas that
// apply the log in different batches store the same bytes.
func (p *partRec) markTail() {
	p.storedNext, p.storedLastTime, p.storedLastIdx = p.Next, p.LastTime, p.LastIdx
}

func (p *partRec) encode() []byte {
	return p.appendTo(make([]byte, 0, 84+len(p.Name)+len(p.FirstTx)))
}

// appendTo appends the encoding of p to b.
//
// Version 3 is version 2 (a record holding FirstTx) in varints, the tail's
// time and index as distances from the creation's: a new partition's record
// shrinks from about 120 bytes to about 60, and a snapshot writes one per
// row (docs/design/state.md, "It writes little, too"). A record without a
// FirstTx is written as version 1, as before; versions 1 and 2 are read.
func (p *partRec) appendTo(b []byte) []byte {
	e := enc{b: b}
	if p.FirstTx != "" {
		e.u8(3)
		e.uv(p.Queue)
		e.uv(p.First)
		e.uv(p.storedNext)
		e.b = binary.AppendVarint(e.b, p.CreatedAt)
		e.uv(p.CreatedIdx)
		e.b = binary.AppendVarint(e.b, p.storedLastTime-p.CreatedAt)
		e.b = binary.AppendVarint(e.b, int64(p.storedLastIdx-p.CreatedIdx))
		e.uv(uint64(p.Gen))
		e.uv(p.GenStart)
		e.b = binary.AppendVarint(e.b, p.Bucket)
		e.str(p.Name)
		e.str(p.FirstTx)
		return e.b
	}
	e.u8(1)
	p.appendFixed(&e)
	return e.b
}

// appendFixed appends the fields versions 1 and 2 share, in fixed widths,
// and the name.
func (p *partRec) appendFixed(e *enc) {
	e.u64(p.Queue)
	e.u64(p.First)
	e.u64(p.storedNext)
	e.i64(p.CreatedAt)
	e.u64(p.CreatedIdx)
	e.i64(p.storedLastTime)
	e.u64(p.storedLastIdx)
	e.u32(p.Gen)
	e.u64(p.GenStart)
	e.i64(p.Bucket)
	e.str(p.Name)
}

// completeTail brings a partition record read from Pebble up to date with
// its partition's messages. A push changes only a partition's tail (Next,
// LastTime, LastIdx) in most batches; it updates the cached record and
// writes it only when another field changes (the first message, retention),
// so a stored record may lag behind the newest messages, which are the
// truth: the last message key gives Next, its record the time and index.
// iter reads the same state the record came from.
func completeTail(p *partRec, tid uint32, pid uint64, iter func(lo, hi []byte) *pebble.Iterator) {
	it := iter(msgKey(tid, p.Queue, pid, p.Next), msgKey(tid, p.Queue, pid, dedupMark))
	if it == nil {
		return
	}
	defer it.Close()
	if !it.Last() {
		return
	}
	m, err := decodeMsg(it.Value())
	if err != nil {
		return
	}
	p.Next = lastU64(it.Key()) + 1
	p.LastTime, p.LastIdx = m.CreatedAt, m.Index
}

func decodePart(b []byte) (*partRec, error) {
	d := dec{b: b}
	v := d.u8()
	if v == 3 {
		return decodePartV3(d)
	}
	if v != 1 && v != 2 {
		return nil, errCorrupt
	}
	p := &partRec{}
	p.Queue = d.u64()
	p.First = d.u64()
	p.Next = d.u64()
	p.CreatedAt = d.i64()
	p.CreatedIdx = d.u64()
	p.LastTime = d.i64()
	p.LastIdx = d.u64()
	p.Gen = d.u32()
	p.GenStart = d.u64()
	p.Bucket = d.i64()
	p.Name = d.str()
	if v == 2 {
		if p.FirstTx = d.str(); p.FirstTx == "" && d.err == nil {
			return nil, errCorrupt
		}
	}
	p.markTail()
	return p, d.err
}

// decodePartV3 decodes the rest of a version 3 record (see appendTo).
func decodePartV3(d dec) (*partRec, error) {
	p := &partRec{}
	p.Queue = d.uv()
	p.First = d.uv()
	p.Next = d.uv()
	p.CreatedAt = d.sv()
	p.CreatedIdx = d.uv()
	p.LastTime = p.CreatedAt + d.sv()
	p.LastIdx = p.CreatedIdx + uint64(d.sv())
	gen := d.uv()
	if gen > math.MaxUint32 {
		d.fail()
	}
	p.Gen = uint32(gen)
	p.GenStart = d.uv()
	p.Bucket = d.sv()
	p.Name = d.str()
	if p.FirstTx = d.str(); d.err == nil && (p.FirstTx == "" || len(d.b) != 0) {
		return nil, errCorrupt
	}
	p.markTail()
	return p, d.err
}

// msgRec is a stored message. Payload is the raw JSON as pushed (or sealed).
type msgRec struct {
	CreatedAt int64
	Index     uint64 // log index of the push
	Sealed    bool
	TxID      string
	TraceID   string
	Payload   []byte
}

func encodeMsg(createdAt int64, index uint64, sealed bool, txid, trace string, payload []byte) []byte {
	return appendMsg(make([]byte, 0, 24+len(txid)+len(trace)+len(payload)), createdAt, index, sealed, txid, trace, payload)
}

// appendMsg appends the encoding of a message to b.
func appendMsg(b []byte, createdAt int64, index uint64, sealed bool, txid, trace string, payload []byte) []byte {
	return append(appendMsgHead(b, createdAt, index, sealed, txid, trace), payload...)
}

// appendMsgHead appends what appendMsg writes before the payload.
func appendMsgHead(b []byte, createdAt int64, index uint64, sealed bool, txid, trace string) []byte {
	e := enc{b: b}
	e.u8(1)
	e.i64(createdAt)
	e.u64(index)
	e.bool(sealed)
	e.str(txid)
	e.str(trace)
	return e.b
}

// decodeMsg decodes a message. The returned slices alias b.
func decodeMsg(b []byte) (msgRec, error) { return decodeMsgStrings(b, false) }

// decodeMsgView is decodeMsg with the strings sharing b's memory (no
// copies), for a b that is never changed afterwards.
func decodeMsgView(b []byte) (msgRec, error) { return decodeMsgStrings(b, true) }

func decodeMsgStrings(b []byte, view bool) (msgRec, error) {
	d := dec{b: b}
	var m msgRec
	if d.u8() != 1 {
		return m, errCorrupt
	}
	m.CreatedAt = d.i64()
	m.Index = d.u64()
	m.Sealed = d.bool()
	if view {
		m.TxID, m.TraceID = d.view(), d.view()
	} else {
		m.TxID, m.TraceID = d.str(), d.str()
	}
	m.Payload = d.b
	return m, d.err
}

// msgTimeIndex decodes just the creation time and log index of a message.
func msgTimeIndex(b []byte) (int64, uint64, bool) {
	d := dec{b: b}
	if d.u8() != 1 {
		return 0, 0, false
	}
	t := d.i64()
	i := d.u64()
	return t, i, d.err == nil
}

// dlqRec is a dead-lettered message of one group.
type dlqRec struct {
	Partition uint64 `json:"p"`
	Offset    uint64 `json:"o"`
	Error     string `json:"e,omitempty"`
	Attempts  uint32 `json:"a"`
	FailedAt  int64  `json:"t"`
}

// MessageID formats the id of the message at (partition, offset).
func MessageID(partition, offset uint64) string {
	var s [36]byte
	formatMessageID(&s, partition, offset)
	return string(s[:])
}

// AppendMessageID appends MessageID(partition, offset) to dst.
func AppendMessageID(dst []byte, partition, offset uint64) []byte {
	var s [36]byte
	formatMessageID(&s, partition, offset)
	return append(dst, s[:]...)
}

func formatMessageID(s *[36]byte, partition, offset uint64) {
	var b [16]byte
	for i := 0; i < 8; i++ {
		b[i] = byte(partition >> (56 - 8*i))
		b[8+i] = byte(offset >> (56 - 8*i))
	}
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], b[10:16])
}

// ParseMessageID is the inverse of MessageID.
func ParseMessageID(id string) (partition, offset uint64, err error) {
	if len(id) != 36 || id[8] != '-' || id[13] != '-' || id[18] != '-' || id[23] != '-' {
		return 0, 0, fmt.Errorf("message id %q: not of the form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", id)
	}
	h := id[0:8] + id[9:13] + id[14:18] + id[19:23] + id[24:36]
	var b [16]byte
	if _, err := hex.Decode(b[:], []byte(h)); err != nil {
		return 0, 0, fmt.Errorf("message id %q: %w", id, err)
	}
	for i := 0; i < 8; i++ {
		partition = partition<<8 | uint64(b[i])
		offset = offset<<8 | uint64(b[8+i])
	}
	return partition, offset, nil
}
