// Package pgsource is the PostgreSQL source connector: it reads committed
// changes of PostgreSQL tables through logical replication (pgoutput) and
// pushes each one as a message, in a partition named after the row's key, in
// commit order, with exactly-once effects.
//
// It owns the checks run before anything in PostgreSQL is touched, the
// publication and the failover slot, the encoding of pgoutput tuples and
// snapshot rows into change events, bundles (one broker transaction that
// carries the messages and moves the pointer), the pointer itself, and the
// watermark snapshot. docs/design/source.md gives the decisions.
package pgsource
