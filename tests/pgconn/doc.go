// Package pgconn tests the PostgreSQL connectors at process level: the
// real queen binary, built by the tests, against a real PostgreSQL, with
// connectors made over HTTP. The broker is killed with kill -9 in the
// middle of a 200,000-row transaction, of a snapshot and of a stream, and
// as the owner of a source in a three-node cluster; a table goes through
// a source and a cdc sink into a copy under kill -9; each trial compares
// the queue or the copy with the table.
package pgconn
