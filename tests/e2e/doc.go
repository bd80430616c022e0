// Package e2e holds the end-to-end tests of the queen broker: each test
// builds nothing itself, starts `queen serve` as a child process (the binary
// is built once by TestMain) and talks to it over real HTTP, checking the
// replies against the contract in docs/http-api.md.
//
// Run with: go test ./tests/e2e/ -count=1
package e2e
