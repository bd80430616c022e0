package main

import "github.com/google/uuid"

// newTxID makes a transaction id for -push-ids: a UUIDv7, as Queen's client
// libraries send with every pushed item (uuid.NewV7 keeps them increasing
// within the process).
func newTxID() string {
	id, err := uuid.NewV7()
	if err != nil {
		// Only a failing system random source; a v4 still names the item.
		return uuid.NewString()
	}
	return id.String()
}
