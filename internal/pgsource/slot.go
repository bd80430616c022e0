package pgsource

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/connector"
)

// createSlot creates the failover slot and writes the new epoch's pointer
// at the slot's consistent point (if nobody wrote the pointer meanwhile).
func (r *run) createSlot(ctx context.Context, p *pointer) error {
	var lsn pglogrepl.LSN
	var s string
	err := r.q.QueryRow(ctx, "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)", r.s.slot).Scan(&s)
	if err != nil {
		return fmt.Errorf("create the failover replication slot %s: %w", r.s.slot, err)
	}
	if lsn, err = pglogrepl.ParseLSN(s); err != nil {
		return err
	}
	p.FlushLSN, p.CommitLSN = lsnJSON(lsn), 0
	op, err := r.ps.op(p)
	if err != nil {
		return err
	}
	out, err := r.s.env.Broker.Transaction(ctx, broker.TxnRequest{Tenant: r.s.env.Tenant, Internal: true, Ops: []broker.TxnOp{op}})
	if err != nil {
		if isConditionFailed(err) {
			return &lostError{err: err}
		}
		return fmt.Errorf("write the new epoch's pointer: %w", err)
	}
	r.ps.wrote(out[0].Version)
	r.s.log.Info("created the replication slot; a new epoch begins", "epoch", p.Epoch, "at", lsn)
	return nil
}

// slotInfo is the slot's row of pg_replication_slots.
type slotInfo struct {
	active       bool
	confirmed    pglogrepl.LSN
	walStatus    string
	invalidation string
}

func (r *run) readSlot(ctx context.Context) (*slotInfo, error) {
	var si slotInfo
	var confirmed, wal, inv, db *string
	var here bool
	err := r.q.QueryRow(ctx, `SELECT active, confirmed_flush_lsn::text, wal_status, invalidation_reason,
		database, database IS NOT DISTINCT FROM current_database()
		FROM pg_replication_slots WHERE slot_name = $1`, r.s.slot).Scan(&si.active, &confirmed, &wal, &inv, &db, &here)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the replication slot %s: %w", r.s.slot, err)
	}
	if !here {
		// Slot names are global to a PostgreSQL cluster: this one is
		// another database's (another source's, or a physical slot), and
		// must be neither read nor dropped.
		owner := "no database (a physical slot)"
		if db != nil {
			owner = "database " + *db
		}
		return nil, connector.Errorf("slot_in_use", nil, "the replication slot %s belongs to %s of this PostgreSQL cluster, and slot names are cluster-wide; set source.slot to a name of this source's own", r.s.slot, owner)
	}
	if confirmed != nil {
		if si.confirmed, err = pglogrepl.ParseLSN(*confirmed); err != nil {
			return nil, err
		}
	}
	if wal != nil {
		si.walStatus = *wal
	}
	if inv != nil {
		si.invalidation = *inv
	}
	return &si, nil
}

// waitSlotFree waits, in phase waiting_for_slot, while another process
// reads the slot.
func (r *run) waitSlotFree(ctx context.Context) error {
	for {
		si, err := r.readSlot(ctx)
		if err != nil || si == nil || !si.active {
			return err
		}
		r.s.env.Status.SetPhase(connector.PhaseWaitingForSlot)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// checkSlot compares the slot and the system with the pointer.
func (r *run) checkSlot(ctx context.Context, p *pointer, sys pglogrepl.IdentifySystemResult) error {
	if p.SystemID != "" && sys.SystemID != p.SystemID {
		return connector.Errorf("system_changed", nil, "the database is a different PostgreSQL cluster (system id %s, the source began on %s), e.g. a restore; POST .../resync to copy it again", sys.SystemID, p.SystemID)
	}
	if sys.Timeline < p.Timeline {
		return connector.Errorf("system_changed", nil, "the database's timeline went back from %d to %d (a restore); POST .../resync to copy it again", p.Timeline, sys.Timeline)
	}
	if err := r.waitSlotFree(ctx); err != nil {
		return err
	}
	si, err := r.readSlot(ctx)
	if err != nil {
		return err
	}
	switch {
	case si == nil:
		return connector.Errorf("slot_lost", nil, "the replication slot %s is gone (dropped, or a failover without failover slots), so changes since %s may be lost; POST .../resync to copy the tables again", r.s.slot, pglogrepl.LSN(p.FlushLSN))
	case si.walStatus == "lost" || si.invalidation != "":
		return connector.Errorf("slot_invalidated", nil, "PostgreSQL invalidated the replication slot %s (%s), so it no longer holds the changes since %s; raise max_slot_wal_keep_size and POST .../resync", r.s.slot, firstNonEmpty(si.invalidation, "wal_status lost"), pglogrepl.LSN(p.FlushLSN))
	case si.confirmed > pglogrepl.LSN(p.FlushLSN):
		return connector.Errorf("slot_ahead", nil, "the replication slot %s was consumed up to %s by someone else, beyond the source's pointer %s, so changes in between are missing; POST .../resync", r.s.slot, si.confirmed, pglogrepl.LSN(p.FlushLSN))
	}
	return nil
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// dropSlot drops the slot if it exists.
func (r *run) dropSlot(ctx context.Context) error {
	_, err := r.q.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()", r.s.slot)
	if err != nil {
		return fmt.Errorf("drop the replication slot %s: %w", r.s.slot, err)
	}
	return nil
}
