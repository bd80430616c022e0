package pgsource

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// readWindow writes a chunk's low watermark, reads the chunk in a short
// REPEATABLE READ, READ ONLY transaction that also reads its snapshot,
// and writes the high watermark (docs/design/source.md, "The watermark
// snapshot"), in one pipeline: one round trip instead of six.
// PostgreSQL runs a pipeline's statements one after the other, so the
// read's snapshot is taken after the low watermark is written and the
// high one is written after the read ended, as with a round trip each;
// each part ends with a Sync, so the markers stay outside the read's
// transaction. A test hook between two parts (afterLow, beforeHigh) has
// the parts before it sent and their results read first.
//
// It returns the high watermark's LSN as PostgreSQL prints it (where the
// marker's record ends). On an error the connection is left to the run,
// which ends and closes it.
func (s *snapshotter) readWindow(ctx context.Context, w *chunkWork, after []string) (high string, err error) {
	h := s.r.s.hooks
	p := s.r.q.PgConn().StartPipeline(ctx)
	defer func() {
		if cerr := p.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("end the pipeline of a snapshot chunk of %s: %w", w.table.name, cerr)
		}
	}()
	// reads holds, in order, how to take the results of what was sent.
	var reads []func() error
	sent := func(what string, rows func(*pgconn.ResultReader) error) {
		reads = append(reads, func() error {
			res, err := p.GetResults()
			if err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			rr, ok := res.(*pgconn.ResultReader)
			if !ok {
				return fmt.Errorf("%s: the pipeline answered %T", what, res)
			}
			if rows != nil {
				if err := rows(rr); err != nil {
					return fmt.Errorf("%s: %w", what, err)
				}
				return nil
			}
			if _, err := rr.Close(); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			return nil
		})
	}
	sync := func(what string) {
		p.SendPipelineSync()
		reads = append(reads, func() error {
			res, err := p.GetResults()
			if err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			if _, ok := res.(*pgconn.PipelineSync); !ok {
				return fmt.Errorf("%s: the pipeline answered %T, want its sync", what, res)
			}
			return nil
		})
	}
	// drain sends what is queued and reads its results.
	drain := func() error {
		if err := p.Flush(); err != nil {
			return fmt.Errorf("send a snapshot chunk's queries: %w", err)
		}
		for _, read := range reads {
			if err := read(); err != nil {
				return err
			}
		}
		reads = reads[:0]
		return nil
	}
	emit := "SELECT pg_logical_emit_message(false, $1, $2, true)::text"
	p.SendQueryParams(emit, [][]byte{[]byte(s.prefix), []byte("L:" + w.id)}, nil, nil, nil)
	sent("write the snapshot's low watermark", nil)
	sync("write the snapshot's low watermark")
	if h != nil && h.afterLow != nil {
		if err := drain(); err != nil {
			return "", err
		}
		h.afterLow(w.table.name)
	}

	t := w.table
	p.SendQueryParams("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", nil, nil, nil, nil)
	sent("begin a snapshot chunk of "+t.name, nil)
	p.SendQueryParams("SELECT pg_current_snapshot()::text", nil, nil, nil, nil)
	sent("read the chunk's snapshot", func(rr *pgconn.ResultReader) error {
		snap, err := oneValue(rr)
		w.xip, w.xmax = parseSnapshot(snap)
		return err
	})
	w.chunk = newChunk(t, w.rel, w.limit, s.arenaHint, s.spare)
	s.spare = nil
	p.SendQueryParams(chunkQuery(t, after != nil, w.limit), chunkParams(after), nil, nil, chunkFormats(t))
	sent("read a snapshot chunk of "+t.name, w.chunk.fill)
	p.SendQueryParams("COMMIT", nil, nil, nil, nil)
	sent("end a snapshot chunk of "+t.name, nil)
	sync("end a snapshot chunk of " + t.name)
	if h != nil && h.beforeHigh != nil {
		if err := drain(); err != nil {
			return "", err
		}
		h.beforeHigh(t.name)
	}

	p.SendQueryParams(emit, [][]byte{[]byte(s.prefix), []byte("H:" + w.id)}, nil, nil, nil)
	sent("write the snapshot's high watermark", func(rr *pgconn.ResultReader) error {
		high, err = oneValue(rr)
		return err
	})
	sync("write the snapshot's high watermark")
	if err := drain(); err != nil {
		return "", err
	}
	return high, nil
}

// oneValue is the only value of a one-row, one-column result, as text
// (and closes rr).
func oneValue(rr *pgconn.ResultReader) (string, error) {
	var v string
	n := 0
	for rr.NextRow() {
		if vals := rr.Values(); len(vals) == 1 {
			v = string(vals[0])
		}
		n++
	}
	if _, err := rr.Close(); err != nil {
		return "", err
	}
	if n != 1 {
		return "", fmt.Errorf("%d rows, want 1", n)
	}
	return v, nil
}
