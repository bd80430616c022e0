package httpapi

import (
	"net/http"

	"github.com/queen-mq/queen/internal/broker"
)

// statuses maps the broker's error codes (and this package's own) to HTTP
// statuses. The broker speaks codes only; the status is this layer's.
var statuses = map[string]int{
	"invalid_parameter":      http.StatusBadRequest,
	"invalid_json":           http.StatusBadRequest,
	"invalid_request":        http.StatusBadRequest,
	"invalid_connector":      http.StatusBadRequest,
	"not_a_source":           http.StatusBadRequest,
	"unauthorized":           http.StatusUnauthorized,
	"forbidden":              http.StatusForbidden,
	"reserved_key":           http.StatusForbidden,
	"not_found":              http.StatusNotFound,
	"queue_not_found":        http.StatusNotFound,
	"group_not_found":        http.StatusNotFound,
	"key_not_found":          http.StatusNotFound,
	"member_not_found":       http.StatusNotFound,
	"connector_not_found":    http.StatusNotFound,
	"request_timeout":        http.StatusRequestTimeout,
	"conflict":               http.StatusConflict,
	"condition_failed":       http.StatusConflict,
	"kind_change":            http.StatusConflict,
	"last_member":            http.StatusConflict,
	"join_wrong_node":        http.StatusConflict,
	"encryption_required":    http.StatusConflict,
	"payload_too_large":      http.StatusRequestEntityTooLarge,
	"queue_full":             http.StatusTooManyRequests,
	"internal":               http.StatusInternalServerError,
	"unknown_command":        http.StatusInternalServerError,
	"decryption_failed":      http.StatusInternalServerError,
	"unavailable":            http.StatusServiceUnavailable,
	"overloaded":             http.StatusServiceUnavailable,
	"node_stopped":           http.StatusServiceUnavailable,
	"join_pending":           http.StatusServiceUnavailable,
	"join_unreachable":       http.StatusServiceUnavailable,
	"encryption_key_missing": http.StatusServiceUnavailable,
	"insufficient_storage":   http.StatusInsufficientStorage,
}

// fieldStatuses holds the codes whose status differs when the refusal
// names an input field: then the request is the client's to fix (a
// connector's password without a key, a queue's encryptionEnabled option
// on a node without one); without a field the server side is at fault.
var fieldStatuses = map[string]int{
	"encryption_required":    http.StatusBadRequest,
	"encryption_key_missing": http.StatusBadRequest,
}

// statusOf is the HTTP status of a refusal; an unknown code is a 500.
func statusOf(e *broker.Error) int {
	if e.Field != "" {
		if st, ok := fieldStatuses[e.Code]; ok {
			return st
		}
	}
	if st, ok := statuses[e.Code]; ok {
		return st
	}
	return http.StatusInternalServerError
}
