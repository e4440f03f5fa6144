// Package fkmat keeps a foreign-key join of two Postgres tables materialized
// as a real Postgres table, from logical replication, with its join state in
// Redis.
//
// The root package owns the domain and the orchestration and is usable as a
// library: the configuration model (YAML and validation), the batch loop
// (cdc → join → sink → redisstore → acknowledgement), backfill, verify and
// status. It imports the packages below; none of them imports it.
//
//   - cdc: the replication connection, pgoutput decoding, acknowledgements.
//   - join: the pure join logic (sender, subscriptions, resolver).
//   - redisstore: the join state in Redis.
//   - sink: the target writer.
//   - migrations: fkmat's metadata schema in the target database.
package fkmat
