// Package integration holds fkmat's end-to-end tests against real Postgres
// (wal_level=logical) and real Redis started by internal/testenv: the daemon
// from the outside, fault injection, and the SQL-oracle comparison that every
// test ends with.
package integration
