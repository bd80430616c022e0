package pgsink

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/queen-mq/queen/internal/connector"
)

// refusal is a message the table cannot take: PostgreSQL refused its
// values, or the mode cannot read it. It is retried, then dead-lettered.
type refusal struct{ text string }

func (r *refusal) Error() string { return r.text }

func refuse(format string) error { return &refusal{text: format} }

// dataError reports whether err is PostgreSQL refusing this message's data
// (its values, a constraint, a trigger raising), as opposed to the
// connection, the server's state or the sink's setup.
func dataError(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.Code[:2] {
	case "22", // data exception: bad value, out of range, invalid text
		"23",             // integrity constraint: not null, unique, check, foreign key
		"P0",             // raised by a PL/pgSQL trigger or function
		"2F", "38", "39", // SQL function and external routine exceptions
		"44": // WITH CHECK OPTION violation
		return true
	}
	switch pe.Code {
	case "42804", // datatype mismatch (a value of the wrong JSON shape for a column)
		"21000", // cardinality violation
		"42P18", // indeterminate datatype
		"428C9": // a value given for a GENERATED ALWAYS identity column
		return true
	}
	return false
}

// transient reports whether err is worth retrying with backoff and never
// dead-letters anything: the connection, deadlocks, serialization
// failures, a server shutting down or out of resources.
func transient(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "40001", "40P01", "55P03", "57014", "57P01", "57P02", "57P03", "58000", "58030", "25P02", "25P03":
			return true
		}
		switch pe.Code[:2] {
		case "08", "53":
			return true
		}
		return false
	}
	// Anything not from the server (a dropped connection, a timeout, a
	// refused connect) is the network's.
	return !errors.Is(err, context.Canceled)
}

// fatal turns an error that is neither data nor transient into the sink's
// coded error, when it has a known cause.
func fatal(err error, table string) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == "42501":
			return connector.Errorf("permission", err, "the sink's role lacks a privilege on %s (%s); grant INSERT, UPDATE and DELETE on it (TRUNCATE for cdc truncates) and SELECT, INSERT, UPDATE on the progress table", table, pe.Message)
		case pe.Code == "42P01":
			return connector.Errorf("table_missing", err, "a table the sink writes is gone (%s); create it, or fix the document's table", pe.Message)
		case strings.HasPrefix(pe.Code, "42"):
			return connector.Errorf("statement", err, "PostgreSQL refused the sink's statement on %s (%s); fix the table or the document", table, pe.Message)
		}
	}
	return err
}

// errorText is the database's own words for a refusal (with its detail).
func errorText(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		s := pe.Message
		if pe.Detail != "" {
			s += " (" + pe.Detail + ")"
		}
		return s + " [SQLSTATE " + pe.Code + "]"
	}
	return err.Error()
}
