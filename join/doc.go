// Package join is fkmat's pure foreign-key join logic: the row model, the key
// encoding shared with the state store, and the engine that turns a batch of
// source changes into target upserts/deletes plus the state mutations to persist.
//
// The engine follows the KIP-213 foreign-key join in three stages:
//
//   - the sender compares a left row's stored state with its new version and
//     emits subscription instructions (subscribe, unsubscribe, refresh, delete),
//     each carrying the hash of the new left value;
//   - the subscription side applies the instructions to the subscription set,
//     answers each with a response holding the right row at that moment, and
//     fans a right change out to every left row subscribed to its key;
//   - the resolver checks each response against the current left row (same
//     foreign key, same value hash) and discards stale ones, so stages may run
//     out of order without ever producing a stale joined row.
//
// The package does no I/O of its own: it reads state through [StateReader],
// which the redisstore package implements, and returns [Mutations] for the
// caller to persist atomically with the batch's checkpoint. It has no clock,
// no goroutines and no network.
package join
