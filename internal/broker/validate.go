package broker

import (
	"fmt"
	"unicode/utf8"
)

// Limits of names and requests (API.md, "Conventions").
const (
	MaxNameLen      = 128
	MaxPartitionLen = 128
	MaxTxIDLen      = 256
	MaxBatch        = 10000
	MaxPartitions   = 10000
	MaxPushItems    = 10000
	MinLeaseSeconds = 5
	MaxLeaseSeconds = 3600
	MaxTimeoutMs    = 3600000
)

// ValidName checks a queue or consumer group name: 1-128 bytes of
// [A-Za-z0-9._:-].
func ValidName(field, s string) *Error {
	if len(s) == 0 {
		return invalid(field, "%s must not be empty", field)
	}
	if len(s) > MaxNameLen {
		return invalid(field, "%s is %d bytes; at most %d are allowed", field, len(s), MaxNameLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return invalid(field, "%s may contain only letters, digits and . _ : - (found %q at byte %d)", field, c, i)
		}
	}
	return nil
}

// ValidPartition checks a partition name: any UTF-8 of 0-128 bytes.
func ValidPartition(field, s string) *Error {
	if len(s) > MaxPartitionLen {
		return invalid(field, "%s is %d bytes; at most %d are allowed", field, len(s), MaxPartitionLen)
	}
	if !utf8.ValidString(s) {
		return invalid(field, "%s is not valid UTF-8", field)
	}
	return nil
}

func checkRange(field string, v, lo, hi int64) *Error {
	if v < lo || v > hi {
		return invalid(field, "%s must be between %d and %d, got %d", field, lo, hi, v)
	}
	return nil
}

func itemField(list string, i int, name string) string {
	return fmt.Sprintf("%s[%d].%s", list, i, name)
}
