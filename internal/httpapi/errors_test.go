package httpapi

import (
	"testing"

	"github.com/queen-mq/queen/internal/broker"
)

// TestStatusOf: the codes whose status depends on a named field, and the
// fallback for a code the table does not know.
func TestStatusOf(t *testing.T) {
	for _, c := range []struct {
		code, field string
		want        int
	}{
		{"invalid_parameter", "limit", 400},
		{"queue_full", "", 429},
		{"insufficient_storage", "", 507},
		{"encryption_key_missing", "", 503},
		{"encryption_key_missing", "options.encryptionEnabled", 400},
		{"encryption_required", "", 409},
		{"encryption_required", "connection.password", 400},
		{"queue_not_found", "queue", 404},
		{"no_such_code", "", 500},
	} {
		if got := statusOf(&broker.Error{Code: c.code, Field: c.field}); got != c.want {
			t.Errorf("statusOf(%s, field %q) = %d, want %d", c.code, c.field, got, c.want)
		}
	}
}
