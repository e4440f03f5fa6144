// Package migrations holds fkmat's metadata schema for the target database
// (checkpoints, state epoch, configuration fingerprint) as embedded SQL files,
// applied in order and idempotently.
package migrations
