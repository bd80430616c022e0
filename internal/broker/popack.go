package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/state"
)

// ErrAckNotSent wraps the error an AckDone receives when a pop's acks were
// never submitted (a refused pop or ack request): the caller may send them
// on their own.
var ErrAckNotSent = errors.New("the acknowledgements were not sent")

// ackFirst submits a pop's acks (PopRequest.Acks) and returns once their
// command is queued for the log on this node, as leader, or, when it went
// to another node, once it was applied or failed: a pop queued after that
// comes after it in the log, so the acked messages are settled before the
// pop leases. The ack goes on in the background (its reply waits for the
// log's fsync, the pop's does not) and reports to req.AckDone; it is not
// cut short by ctx, as an ack of a batch already written must not be.
// An error means nothing was sent (AckDone has been called with it).
func (b *Broker) ackFirst(ctx context.Context, req PopRequest) error {
	if req.AckDone == nil {
		return invalid("acknowledgments", "a pop that carries acknowledgements needs AckDone")
	}
	cmd, err := ackCommand(req.Tenant, req.Acks, "acknowledgments")
	if err != nil {
		req.AckDone(nil, fmt.Errorf("%w: %w", ErrAckNotSent, err))
		return err
	}
	queued := make(chan struct{})
	var once sync.Once
	signal := func() { once.Do(func() { close(queued) }) }
	actx := cluster.OnQueued(context.WithoutCancel(ctx), signal)
	go func() {
		out, err := b.submitAck(actx, req.Tenant, req.Acks, cmd)
		signal() // forwarded, or refused before it was queued
		req.AckDone(out, err)
	}()
	<-queued
	return nil
}

// submitAck proposes an ack command built by ackCommand and returns its
// outcome, as Ack does.
func (b *Broker) submitAck(ctx context.Context, tenant string, items []AckItem, cmd *state.Ack) ([]AckOutcome, error) {
	v, err := b.submit(ctx, cmd, 64*len(items))
	if err != nil {
		return nil, err
	}
	r, ok := v.(*state.AckResult)
	if !ok {
		return nil, fmt.Errorf("ack: unexpected result %T", v)
	}
	if r.Err != nil {
		return nil, fromState(r.Err)
	}
	knownTxIDs(items, cmd.Items, r.Items)
	b.countAcks(tenant, cmd.Items, r.Items)
	return r.Items, nil
}
