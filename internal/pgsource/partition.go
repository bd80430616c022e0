package pgsource

import (
	"crypto/sha256"
	"encoding/hex"
)

// maxPartitionName is the longest partition name the broker takes; a longer
// one is replaced by "~" and the first 32 hex digits of its SHA-256.
const maxPartitionName = 128

// singlePartition is the partition of a table with partitionBy "single".
const singlePartition = "all"

// appendPartitionValue appends one value of a partition name: as printed,
// with a vertical bar or backslash escaped by a backslash when the name has
// several values; NULL is \N.
func appendPartitionValue(buf []byte, v []byte, null, composite bool) []byte {
	if null {
		return append(buf, '\\', 'N')
	}
	if !composite {
		return append(buf, v...)
	}
	for _, c := range v {
		if c == '|' || c == '\\' {
			buf = append(buf, '\\')
		}
		buf = append(buf, c)
	}
	return buf
}

// partitionName finishes a name built by appendPartitionValue: names over
// 128 bytes become "~" + 32 hex digits of their SHA-256.
func partitionName(name []byte) string {
	if len(name) <= maxPartitionName {
		return string(name)
	}
	sum := sha256.Sum256(name)
	return "~" + hex.EncodeToString(sum[:16])
}
