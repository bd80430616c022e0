package cluster

import (
	"context"
	"errors"
)

// isContextErr reports whether err is a context's end (the caller cancelled
// or its deadline passed), as opposed to a failure of the cluster.
func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
