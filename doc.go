// Package fkmat keeps a foreign-key join of Postgres tables (a star or a
// chain of them; two is the smallest) materialized as a real Postgres
// table, from logical replication, with its join state in Redis.
//
// The root package is the API the command line calls (Run, Check, Plan,
// Status, Verify, Backfill, Teardown, Migrate) and the daemon behind Run: it
// connects, checks and backfills, supervises the streaming engine of
// internal/pipeline with the replication stream, and decides what an error
// means (errors.go). It imports the packages below; none of them imports
// it.
//
//   - internal/config: the config file; internal/plan: a join resolved
//     against the catalog.
//   - internal/pipeline: the streaming engine (batches, join, commits,
//     acknowledgements).
//   - cdc: the replication connection, pgoutput decoding, acknowledgements.
//   - join: the pure join logic (sender, subscriptions, resolver).
//   - redisstore: the join state in Redis.
//   - sink: the target writer.
//   - migrations: fkmat's metadata schema in the target database.
//
// docs/architecture.md maps each concept to its file.
package fkmat
