// Package connector owns what every PostgreSQL connector shares: the
// connector documents (their Go types, defaults and validation), sealing of
// their passwords, where they live in the replicated state, the reload loop
// that starts and stops connectors on every node, ownership leases, this
// node's status of each connector, and the connector metrics.
//
// The connectors themselves live in internal/pgsink and internal/pgsource.
// They implement Factory and are handed to the runtime by cmd/queen, so this
// package imports neither of them. Both reach the broker only through its Go
// API (internal/broker), in process.
package connector
