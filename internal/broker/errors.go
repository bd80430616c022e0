package broker

import (
	"context"
	"errors"
	"fmt"

	"github.com/queen-mq/queen/internal/cluster"
	"github.com/queen-mq/queen/internal/state"
)

// Error is the broker's one error type: a refusal with an API error code
// (e.g. "queue_not_found") and, when one input field is at fault, its JSON
// path. Every error of the broker's API converts to it (AsError); the HTTP
// layer maps its code to a status.
type Error struct {
	Code    string
	Message string
	Field   string
	// Operation is the index of the refused operation of a transaction.
	Operation *int
	// CurrentVersion is the version of a KV key whose condition failed
	// (0 = absent).
	CurrentVersion *uint64
}

func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s: %s (%s)", e.Code, e.Message, e.Field)
	}
	return e.Code + ": " + e.Message
}

func invalid(field, format string, args ...any) *Error {
	return &Error{Code: "invalid_parameter", Field: field, Message: fmt.Sprintf(format, args...)}
}

func fromState(e *state.Error) *Error {
	if e == nil {
		return nil
	}
	return &Error{Code: e.Code, Message: e.Message}
}

// AsError converts any error of the broker into an *Error for the API.
func AsError(err error) *Error {
	var be *Error
	if errors.As(err, &be) {
		return be
	}
	var ce *cluster.Error // a refusal of the cluster layer (insufficient_storage on a full disk)
	if errors.As(err, &ce) {
		return &Error{Code: ce.Code, Message: ce.Message}
	}
	if errors.Is(err, cluster.ErrNotLeader) {
		return &Error{Code: "unavailable", Message: "no leader is available to accept writes right now; retry shortly (" + err.Error() + ")"}
	}
	if errors.Is(err, cluster.ErrStopped) {
		return &Error{Code: "node_stopped", Message: err.Error() + "; retry against another node"}
	}
	if errors.Is(err, cluster.ErrShutdown) {
		return &Error{Code: "unavailable", Message: "the node is shutting down; retry against another node"}
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return &Error{Code: "unavailable", Message: "the request ended before the cluster answered (" + err.Error() + "); a write may still be applied: read the current state before retrying"}
	}
	return &Error{Code: "internal", Message: err.Error()}
}
