package pgsource

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// statusEvery bounds how long a committed bundle's position waits before
// it is sent to PostgreSQL (it is sent with every keepalive anyway).
const statusEvery = time.Second

// statusInterval is how often the stream tells PostgreSQL how far it got,
// well inside the default wal_sender_timeout (60 s).
const statusInterval = 10 * time.Second

// stream reads pgoutput messages from a replication connection and
// confirms positions back.
type stream struct {
	conn *pgconn.PgConn
	// flushed is what the stream confirms: never ahead of the pointer.
	flushed    pglogrepl.LSN
	lastStatus time.Time
	// synced is the committer's confirmable position (nil: none); busy
	// reports bundles in flight, whose positions are sent within
	// statusEvery of their commit.
	synced *atomic.Uint64
	busy   func() bool
	// unsent: flushed moved since the last status update.
	unsent bool
	// sent, when set (tests), learns each status update's position.
	sent func(pglogrepl.LSN)
	// beforeWait, when set, runs before a read that may wait on the
	// network (nothing received is buffered).
	beforeWait func()
	// watched is the context whose end interrupts a read (see read);
	// unwatch stops that.
	watched context.Context
	unwatch func() bool
	// deadline is the connection's read deadline as read last set it
	// (zero: unknown, set it again).
	deadline time.Time
}

// startStream starts logical replication of slot at start: pgoutput,
// protocol version 1, streaming off (only committed transactions), with
// logical messages (heartbeats and watermarks).
func startStream(ctx context.Context, conn *pgconn.PgConn, slot, publication string, start pglogrepl.LSN) (*stream, error) {
	err := pglogrepl.StartReplication(ctx, conn, slot, start, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + publication + "'", "messages 'true'", "streaming 'off'"},
	})
	if err != nil {
		return nil, fmt.Errorf("start replication of slot %s at %s: %w", slot, start, err)
	}
	return &stream{conn: conn, flushed: start, lastStatus: time.Now()}, nil
}

// confirm takes up what the committer made confirmable: everything up to
// it is safe in the broker and may be recycled. It reports whether that
// moved the position.
func (s *stream) confirm() bool {
	if s.synced == nil {
		return false
	}
	if lsn := pglogrepl.LSN(s.synced.Load()); lsn > s.flushed {
		s.flushed = lsn
		return true
	}
	return false
}

// sendStatus tells PostgreSQL the confirmed position now.
func (s *stream) sendStatus(ctx context.Context) error {
	s.confirm()
	s.unsent = false
	s.lastStatus = time.Now()
	err := pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: s.flushed, WALFlushPosition: s.flushed, WALApplyPosition: s.flushed,
	})
	if err != nil {
		return fmt.Errorf("confirm %s to PostgreSQL: %w", s.flushed, err)
	}
	if s.sent != nil {
		s.sent(s.flushed)
	}
	return nil
}

// read receives one message, waiting until d at most (it may return a
// timeout sooner). A context with a deadline per message would cost pgconn
// a watcher (and its allocations) for every row change: the wait is the
// connection's read deadline instead, and ctx's end interrupts it through
// one watch per context. The deadline is moved only when d is earlier
// than the one set, or that one passed: moving it for every message would
// reset a runtime timer per row change, and a read that times out early
// is simply retried by next.
func (s *stream) read(ctx context.Context, d time.Time) (pgproto3.BackendMessage, error) {
	nc := s.conn.Conn()
	if s.watched != ctx {
		s.stopWatch()
		s.watched, s.deadline = ctx, time.Time{}
		s.unwatch = context.AfterFunc(ctx, func() { _ = nc.SetReadDeadline(time.Unix(1, 0)) })
	}
	if s.deadline.IsZero() || d.Before(s.deadline) {
		if err := nc.SetReadDeadline(d); err != nil {
			s.deadline = time.Time{}
			return nil, fmt.Errorf("set the replication stream's read deadline: %w", err)
		}
		s.deadline = d
	}
	// Checked after the deadline is set: an end of ctx from here on moves
	// the deadline into the past, so the read returns at once.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m, err := s.conn.ReceiveMessage(context.Background())
	if err != nil {
		// The deadline passed (or the connection failed): set it anew.
		s.deadline = time.Time{}
	}
	return m, err
}

// stopWatch ends read's watch of its context.
func (s *stream) stopWatch() {
	if s.unwatch != nil {
		s.unwatch()
		s.unwatch, s.watched = nil, nil
	}
}

// next returns the next pgoutput message and the WAL position it starts
// at, or nil when wait passed without one. The message's bytes are valid
// until the following call. Keepalives are answered here.
func (s *stream) next(ctx context.Context, wait time.Duration) ([]byte, pglogrepl.LSN, error) {
	now := time.Now()
	deadline := now.Add(wait)
	for first := true; ; first = false {
		if !first {
			now = time.Now()
		}
		if s.confirm() {
			s.unsent = true
		}
		since := now.Sub(s.lastStatus)
		if since >= statusInterval || s.unsent && since >= statusEvery {
			if err := s.sendStatus(ctx); err != nil {
				return nil, 0, err
			}
		}
		d := deadline
		due := s.lastStatus.Add(statusInterval)
		switch {
		case s.unsent:
			due = s.lastStatus.Add(statusEvery)
		case s.busy != nil && s.busy():
			// Look for a commit's position now and then.
			due = now.Add(statusEvery / 10)
		}
		if due.Before(d) {
			d = due
		}
		if s.beforeWait != nil && s.conn.Frontend().ReadBufferLen() == 0 {
			s.beforeWait()
		}
		raw, err := s.read(ctx, d)
		if err != nil {
			if ctx.Err() != nil {
				return nil, 0, ctx.Err()
			}
			if pgconn.Timeout(err) {
				if !time.Now().Before(deadline) {
					return nil, 0, nil
				}
				continue
			}
			return nil, 0, fmt.Errorf("read the replication stream: %w", err)
		}
		switch m := raw.(type) {
		case *pgproto3.CopyData:
			if len(m.Data) == 0 {
				continue
			}
			switch m.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
				if err != nil {
					return nil, 0, fmt.Errorf("replication keepalive: %w", err)
				}
				if ka.ReplyRequested {
					if err := s.sendStatus(ctx); err != nil {
						return nil, 0, err
					}
				}
			case pglogrepl.XLogDataByteID:
				x, err := pglogrepl.ParseXLogData(m.Data[1:])
				if err != nil {
					return nil, 0, fmt.Errorf("replication data: %w", err)
				}
				if len(x.WALData) > 0 {
					return x.WALData, x.WALStart, nil
				}
			}
		case *pgproto3.ErrorResponse:
			return nil, 0, pgconn.ErrorResponseToPgError(m)
		case *pgproto3.CopyDone:
			return nil, 0, errors.New("PostgreSQL ended the replication stream")
		}
	}
}
