package cluster

// maxWALWrite bounds the entry data of one raft-wal append. raft-wal's
// segment writer keeps a buffer as large as the largest append it was
// given, for as long as the segment is in the log (a sealed segment
// included), so one large append would hold that much memory per segment.
const maxWALWrite = 1 << 20

// writeChunks writes logs as raft-wal appends of at most maxWALWrite bytes
// of entry data each (an entry larger than that goes alone). Under
// FsyncAlways every append but the last is written without its fsync
// (deferring); the last one's Sync, unless it is deferred too (deferLast),
// fsyncs every segment written since, so the whole costs one fsync as
// before. raft-wal checksums each append: a crash between two leaves the
// log a valid prefix, and raft sends again what this node did not
// acknowledge. Under FsyncAlways, l.mu is held. Each append's records are
// encoded into the codec's kept buffer (walcodec.go).
func (l *syncedLog) writeChunks(logs []*walRecord, deferLast bool) error {
	for len(logs) > 0 {
		n, size := 0, 0
		for n < len(logs) && (n == 0 || size+len(logs[n].Data) <= maxWALWrite) {
			size += len(logs[n].Data)
			n++
		}
		if l.s.mode != FsyncInterval {
			l.s.deferring.Store(n < len(logs) || deferLast)
		}
		var a *walArena
		if l.s.codec != nil {
			a = l.s.codec.begin(logs[:n])
		}
		err := l.WAL.StoreLogs(logs[:n])
		l.s.codec.end(a)
		if err != nil {
			return err
		}
		logs = logs[n:]
	}
	return nil
}
