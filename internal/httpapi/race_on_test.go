//go:build race

package httpapi

// raceDetector: the race detector's instrumentation allocates too, so
// allocation counts are looser under it.
const raceDetector = true
