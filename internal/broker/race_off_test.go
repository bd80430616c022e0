//go:build !race

package broker

// raceDetector: see race_on_test.go.
const raceDetector = false
