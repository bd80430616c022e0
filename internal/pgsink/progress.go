package pgsink

import (
	"context"
	"fmt"
	"slices"

	"github.com/queen-mq/queen/internal/connector"
)

// The progress table's rows: each partition's last resolved offset, locked
// and moved inside the batch's transaction, and the check for messages lost
// to retention before the sink wrote them.

// lockProgress makes sure the batch's partitions have progress rows, locks
// them (in partition order, so workers never deadlock on them) and reads
// their offsets.
func (w *worker) lockProgress(ctx context.Context, parts []*partWork) error {
	pids := make([]int64, len(parts))
	names := make([]string, len(parts))
	for i, p := range parts {
		pids[i], names[i] = int64(p.pid), p.name
	}
	pt := w.s.progress.sql()
	if _, err := w.conn.Exec(ctx, `INSERT INTO `+pt+` (sink, partition_id, partition, last_offset)
		SELECT $1, v.p, v.n, -1 FROM unnest($2::bigint[], $3::text[]) AS v(p, n) ORDER BY v.p
		ON CONFLICT (sink, partition_id) DO NOTHING`, w.s.name, pids, names); err != nil {
		return err
	}
	rows, err := w.conn.Query(ctx, `SELECT partition_id, last_offset FROM `+pt+`
		WHERE sink = $1 AND partition_id = ANY($2::bigint[]) ORDER BY partition_id FOR UPDATE`, w.s.name, pids)
	if err != nil {
		return err
	}
	defer rows.Close()
	last := map[int64]int64{}
	for rows.Next() {
		var pid, off int64
		if err := rows.Scan(&pid, &off); err != nil {
			return err
		}
		last[pid] = off
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, p := range parts {
		off, ok := last[int64(p.pid)]
		if !ok {
			return fmt.Errorf("progress row of partition %d vanished", p.pid)
		}
		p.last = off
	}
	return nil
}

// moveProgress records, per partition, the highest offset now resolved:
// every message up to it is applied or was applied before.
func (w *worker) moveProgress(ctx context.Context, parts []*partWork) error {
	var pids, offs []int64
	for _, p := range parts {
		top := p.last
		for _, it := range p.items {
			if it.state != stApplied {
				if it.state == stSkipped {
					continue
				}
				break
			}
			top = max(top, int64(it.m.Offset))
		}
		if top > p.last {
			pids, offs = append(pids, int64(p.pid)), append(offs, top)
		}
	}
	if len(pids) == 0 {
		return nil
	}
	_, err := w.conn.Exec(ctx, `UPDATE `+w.s.progress.sql()+` AS x SET last_offset = v.o, updated_at = now()
		FROM unnest($2::bigint[], $3::bigint[]) AS v(p, o) WHERE x.sink = $1 AND x.partition_id = v.p`, w.s.name, pids, offs)
	return err
}

// checkGap refuses to go on when messages between the recorded offset and
// the first one delivered were deleted by retention before the sink wrote
// them (dead-lettered ones are resolved, not a gap).
func (w *worker) checkGap(ctx context.Context, p *partWork, first uint64) error {
	s := w.s
	after := uint64(0)
	if p.pid > 0 {
		after = p.pid - 1
	}
	infos, err := s.env.Broker.GroupPartitions(ctx, s.env.Tenant, s.spec.ConsumerGroup, s.spec.Queue, after, 1)
	if err != nil || len(infos) == 0 || infos[0].ID != p.pid {
		return nil
	}
	retained := infos[0].First
	if retained <= uint64(p.last+1) {
		return nil
	}
	dead, _, err := s.env.Broker.DLQ(ctx, s.env.Tenant, s.spec.Queue, s.spec.ConsumerGroup, p.name, 10000, 0)
	if err != nil {
		return nil
	}
	var dl []uint64
	for _, d := range dead {
		dl = append(dl, d.Offset)
	}
	for off := uint64(p.last + 1); off < min(retained, first); off++ {
		if !slices.Contains(dl, off) {
			return connector.Errorf("retention_gap", nil,
				"partition %q lost messages from offset %d to %d to queue retention before the sink wrote them; keep retention longer than the sink may stay down, and to accept the loss delete its progress row (DELETE FROM %s WHERE sink = '%s' AND partition_id = %d)",
				p.name, p.last+1, min(retained, first)-1, s.progress, s.name, p.pid)
		}
	}
	return nil
}
