// Package broker is the broker's Go API: push, pop, ack, leases, dead letters,
// queue and group administration, and the read queries. It validates input,
// generates the ids a client did not give (before proposing, so a retry
// carries them), turns calls into state commands submitted through the
// replicated log, wakes long-polling consumers, and proposes the periodic
// Tick that expires leases. HTTP handlers and in-process connectors both call
// this package; neither talks to internal/state or internal/cluster directly.
// Its one error type is *Error, a refusal named by a code (errors.go; the
// HTTP layer maps codes to statuses); its read views (types.go) and the
// cluster's health, status and membership (cluster.go) are part of its API.
//
// Durability. A call that writes returns once its command is in the raft
// log of a majority of the nodes and applied. With QUEEN_FSYNC=always (the
// default) each of those logs has fsynced it first, so the write survives
// any crash or power loss that leaves a majority's disks. With
// QUEEN_FSYNC=interval the logs have written it to the operating system but
// sync it up to QUEEN_FSYNC_INTERVAL_MS later: it survives kill -9 of any
// node, but a power loss of a majority can lose up to one interval of
// acknowledged writes (never part of one). Code that makes a promise to a
// third party on the strength of a write (a connector source confirming a
// position to PostgreSQL, after which PostgreSQL will not send it again)
// must call WaitSynced after the write and before the promise; under
// either setting that keeps such promises true after a power loss.
package broker
