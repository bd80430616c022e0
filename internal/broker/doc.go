// Package broker is the broker's Go API: push, pop, ack, leases, dead letters,
// queue and group administration, and the read queries. It validates input,
// generates the ids a client did not give (before proposing, so a retry
// carries them), turns calls into state commands submitted through the
// replicated log, wakes long-polling consumers, and proposes the periodic
// Tick that expires leases. HTTP handlers and in-process connectors both call
// this package; neither talks to internal/state or internal/cluster directly.
package broker
