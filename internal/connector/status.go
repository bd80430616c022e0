package connector

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// Phases of a connector on this node.
const (
	PhaseStreaming      = "streaming"
	PhaseSnapshot       = "snapshot"
	PhaseConnecting     = "connecting"
	PhaseStandby        = "standby"
	PhaseWaitingForSlot = "waiting_for_slot"
	PhaseError          = "error"
	PhaseRunning        = "running"
	PhaseDisabled       = "disabled"
	PhaseDeleting       = "deleting"
)

// Error is a connector failure that needs the user: a code from the
// connector reference (table_missing, no_key, slot_lost, ...) and a sentence
// naming the fix.
type Error struct {
	Code    string
	Message string
	Err     error // the cause, when there is one
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s (%v)", e.Code, e.Message, e.Err)
	}
	return e.Code + ": " + e.Message
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf builds a coded connector error.
func Errorf(code string, cause error, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), Err: cause}
}

// AsError returns the coded error inside err, if any.
func AsError(err error) (*Error, bool) {
	var ce *Error
	ok := errors.As(err, &ce)
	return ce, ok
}

// Status is this node's view of one connector (the "status" object of the
// connectors API and of /status' pg block).
type Status struct {
	Phase        string    `json:"phase"`
	Code         string    `json:"code,omitempty"`
	Message      string    `json:"message,omitempty"`
	Since        time.Time `json:"since"`
	PointerLSN   string    `json:"pointerLsn,omitempty"`
	Messages     uint64    `json:"messages"`
	SlotLagBytes *int64    `json:"slotLagBytes,omitempty"`
	Owner        bool      `json:"owner,omitempty"`
}

// StatusReporter holds one connector's Status; safe for concurrent use.
type StatusReporter struct {
	mu sync.Mutex
	s  Status
	// now is the clock; tests may replace it.
	now func() time.Time
}

// NewStatusReporter starts in phase.
func NewStatusReporter(phase string) *StatusReporter {
	r := &StatusReporter{now: time.Now}
	r.s = Status{Phase: phase, Since: r.now().UTC()}
	return r
}

// SetPhase moves to phase and clears any error. Since changes only when
// the phase does.
func (r *StatusReporter) SetPhase(phase string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.s.Phase != phase || r.s.Code != "" {
		r.s.Since = r.now().UTC()
	}
	r.s.Phase, r.s.Code, r.s.Message = phase, "", ""
}

// SetError moves to phase error with err's code and sentence (code
// "internal" for an uncoded error).
func (r *StatusReporter) SetError(err error) {
	code, msg := "internal", err.Error()
	if ce, ok := AsError(err); ok {
		code, msg = ce.Code, ce.Message
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.s.Phase != PhaseError || r.s.Code != code {
		r.s.Since = r.now().UTC()
	}
	r.s.Phase, r.s.Code, r.s.Message = PhaseError, code, msg
}

// Update changes the other fields under the lock.
func (r *StatusReporter) Update(fn func(s *Status)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fn(&r.s)
}

// Get returns a copy.
func (r *StatusReporter) Get() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.s
}
