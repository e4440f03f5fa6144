// Package redisstore keeps the state of one fkmat join in Redis: the
// subscriptions (foreign key -> dependent left rows), the left rows (key ->
// foreign key, value hash, projected values), the right rows, and a meta hash
// with the checkpoint LSN, the state epoch, the generations and the number of
// subscriptions. It implements
// join.StateReader; Store.Commit persists a batch's join.Mutations together
// with the batch's checkpoint, atomically and idempotently; a source
// transaction too large for one batch is written in chunks by
// Store.CommitPartial under an undo log (see Large transactions).
//
// # Key layout
//
// Every key starts with Config.Prefix (e.g. "fkmat:<slot>:<join>"), so a Redis
// ACL user can be limited to "~<prefix>:*":
//
//	<prefix>:meta               hash: epoch, fingerprint, layout (version and Shape), checkpoint, gen_left, gen_right, inflight, subs, resize
//	<prefix>:undo               hash: undo log of the partial transaction in flight
//	<prefix>:s<gen>:{<shard>}   sorted set, all scores 0, member = FK ++ PK (join.Subscription.Member)
//	<prefix>:l<gen>:{<bucket>}  hash: encoded left PK -> left row
//	<prefix>:r<gen>:{<bucket>}  hash: encoded right key -> right row
//
// shard = xxhash64(encoded FK) mod SubShards, bucket = xxhash64(encoded key)
// mod the side's bucket count; gen is the side's generation in base 36
// (subscriptions belong to the left side). Because join keys are prefix-free,
// the subscriptions of FK k are exactly the members with prefix k, and
// Dependents is one ZRANGE <set> (k++after (PrefixEnd(k) BYLEX LIMIT 0 n:
// exclusive bounds, paging by the last member, never by a growing offset.
//
// # Shape: bucket counts sized at Init, and Resize
//
// The counts are the state's Shape, recorded in the meta hash's layout
// field ("v2/sub_shards=S/left_buckets=L/right_buckets=R", then the fans)
// and read from it by every store that opens the state. Init sizes each
// side's buckets for its expected rows (Size): a power of two giving at
// most 64 rows per bucket, 2^10..2^22 (2^10 for an empty table). A hash
// stays in Redis's compact listpack encoding up to 512 fields of at most
// 64 bytes; past that it becomes a hashtable, correct but 2-3 times
// larger. Few, full buckets matter at small sizes: at 1M orders, 2^18
// buckets (4 rows each) cost 95 B per left row in MEMORY USAGE, 16384
// buckets (61 each) 65 B. Config.RowShards fixes the counts instead
// (tests), and a state of other counts is then ErrLayout.
//
// A state whose tables grow is resized (resize.go): Outgrown compares
// the shape Init would give it now with its own, and once some side's
// buckets would be 4 times as many, or a fan's lanes twice, Resize writes
// that side's rows (and members) to new generations laid out for the new
// shape, then switches layout and generations in one write of the meta
// hash. Keys whose contents stay together (the subscription sets when only
// the row buckets change) are copied on the server. Until the switch the
// meta field resize names the new generations, which Sweep spares; a
// Resize cut short is forgotten by Recover and its keys are swept. Nothing
// else may write the state meanwhile: the daemon runs it between batches.
// On a cluster a second scan checks that no key of the old generations
// was missed (a slot migrating from a primary not yet scanned to one
// already scanned); one that was fails the resize, which is tried again.

// Rows are a lean binary encoding (see codec.go): the value of a row's
// field holds only what the field (the encoded key) does not say: the
// projected values, the foreign key as references to the projected values
// it equals (one byte per column), and the key's text only when the
// encoded key does not give it back exactly (a numeric "1.50"). The value
// hash is recomputed when a row is read. The bench's orders row (id,
// customer_id, amount, a 32-byte note) takes 52 bytes, within listpack's
// 64; layout version 1 repeated the key, the foreign key and the hash, took
// 75 and fell out of listpack, which cost 170 B per left row in W4 against
// 65 B now (213 B against 87 B with all state).
//
// # Generations and TRUNCATE
//
// A Clear in a batch bumps the side's generation in the same transaction, so
// a TRUNCATE costs O(1): the new generation starts empty and the old keys are
// garbage that Store.Sweep deletes later (SCAN MATCH + UNLINK, a bounded step
// at a time, each step under WATCH of the meta hash so that it never deletes
// a generation a concurrent commit just made current). Init starts random
// generations, so keys left behind by a state whose meta hash was lost are
// never mistaken for the new state's.
//
// # Subscription count
//
// The meta field subs counts the subscriptions of the current left
// generation (Meta.Subscriptions), so that status reports it without scanning
// 2^20 sets. Init sets it to 0; every write sets it in the MULTI that changes
// the sets: a ClearLeft starts it from 0, then Commit adds len(AddSubs) -
// len(DelSubs), exact because the engine's Mutations are net against the
// state the batch read, and CommitPartial adds the members it finds absent
// (added) or present (removed) in its pre-images, exact even for a chunk
// sent twice. The replies of the ZADDs and ZREMs, which come after EXEC,
// check the count: mutations that were not net (a batch applied again at a
// new LSN) are corrected by one more MULTI right after. A state written
// before the counter existed has no subs field and reads as unknown (-1), and
// stays so (rather than counting from a wrong base) until Init or a ClearLeft.
//
// # Atomicity and replay
//
// Commit WATCHes the meta hash, checks the epoch, and sends the batch's
// commands (chunked into commands of at most Config.PageSize arguments) and
// the new checkpoint and generations in one MULTI/EXEC. A batch whose LSN is
// not above the stored checkpoint was applied before and is skipped, so
// replaying batches after a crash is a no-op and a replayed TRUNCATE cannot
// wipe later writes. A transaction discarded by Redis (EXECABORT, e.g. OOM
// while queueing) changes nothing; a command failing inside EXEC (only
// possible if foreign data of the wrong type sits on our keys) cannot be
// rolled back, so Commit then drops the epoch from the meta hash, which the
// daemon sees as lost state, and rebuilds.
//
// # Large transactions
//
// A source transaction larger than the batch bound (say 500k rows) is
// processed in chunks so that memory stays bounded: the engine applies chunk
// k against the store, so chunk k must see what chunks before it wrote, and
// its output goes into the one target transaction that stays open. Each
// chunk's Mutations therefore go to Redis at once, with
// Store.CommitPartial(ctx, m, txn), but the checkpoint stays put until the
// target transaction commits and Store.FinishPartial(ctx, lsn) moves it. If
// the process dies in between, or the replication stream restarts the
// transaction from its first chunk, Store.Recover brings Redis back to the
// state at its checkpoint, and the transaction is replayed.
//
// CommitPartial is Commit plus an undo log, in the same MULTI/EXEC: before
// it, under WATCH of the meta hash, it reads the current value of every hash
// field (HMGET) and sorted-set member (ZMSCORE) the chunk touches; in the
// MULTI it records them with HSETNX in the hash <prefix>:undo, so only the
// first touch in the transaction counts and the log holds the values from
// before the transaction. A field is the data key without the prefix
// ("l<gen>:{<bucket>}", ending at its '}') followed by the hash field or
// member; a value is "=" and the old field value, "-" for a field or member
// that was absent, or "+" for a member that was present (scores are all 0).
// A Clear bumps the generation as in Commit and records the previous one
// ("m:gen_left", "m:gen_right"), and the first chunk records the
// subscription count ("m:subs", "-" when unknown). The chunk's writes to the
// new generation are logged like any other, as absent, so a rollback leaves
// no keys in it. The meta field inflight holds the transaction's id from the
// first chunk on.
// While it is set, Commit and a partial commit of another transaction fail
// with ErrInFlight, and Sweep deletes nothing, since Recover may make a
// replaced generation current again.
//
// FinishPartial sets the checkpoint, clears the marker and UNLINKs the log
// (freed in the background) in one MULTI; retried with the marker gone and
// an LSN not above the checkpoint it is a no-op. Recover HSCANs the log a
// page (Config.PageSize entries) at a time, and for each page writes the
// pre-images back and deletes their entries in one MULTI, so memory is
// bounded and a crash midway loses no progress; the generations, the
// subscription count, the log and the marker go last, in one more MULTI. Each step is idempotent and the
// marker stays until the end, so an interrupted Recover is completed by
// calling it again. While a transaction is in flight the log costs about as
// much memory as the rows and members it touched. On the test host, 100k
// rows rewritten in 6 chunks (200k log entries) took 1.2 s, and rolling them
// back 1.2 s (393 pages of 512).
//
// # Measured layout choice
//
// BenchmarkLayout, 3M subscriptions (15 per FK, 200k FKs, bigint keys) and
// 3M left rows, Redis 7.0 in the test container, 2 shared vCPUs; memory is
// the INFO used_memory delta per item, lookup cost is the server-side
// usec_per_call of ZRANGE/HGET (the client round trip through the container
// proxy is ~100-160 µs for all layouts and says little):
//
//	subscriptions                      B/sub  server µs/lookup  encoding
//	sharded, 16384 sets                110.6  12.0              mostly skiplist (~183/set)
//	sharded, 65536 sets                 17.1   7.4              listpack (~46/set)
//	sharded, 262144 sets                18.9   6.1              listpack
//	sharded, 1048576 sets (default)     20.3   6.2              listpack
//	one set per FK (15 PKs each)        14.9   3.3              listpack
//	one big set                        111.8   8.8              skiplist
//
//	left rows                          B/row  server µs/get     encoding
//	32-byte row, 16384 buckets          57.2   4.8              listpack (~183/bucket)
//	32-byte row, 262144 (default)       67.4   3.6              listpack (~11/bucket)
//	32-byte row, a string key per row  154.5   3.1              raw string
//	125-byte row, 16384 buckets        214.2   5.1              hashtable (value > 64 B)
//	125-byte row, 262144 buckets       230.1   5.2              hashtable
//	125-byte row, a string key per row 272.8   4.9              raw string
//	125-byte row, 16384 buckets,       156.2   6.4              listpack
//	  hash-max-listpack-value 256
//
// Batch reads: GetLeft of 1000 random rows costs 4.5-8 µs per row from the
// client, in one pipelined round trip. Loading through Commit (50k items per
// MULTI) ran at 210-250k subscriptions/s and 90-220k rows/s on this host.
//
// A sorted set leaves the listpack encoding beyond 128 members (or 64-byte
// members) and then costs ~6x the memory; the cliff is steep on the
// under-sharded side and the cost of over-sharding is mild (a set per FK at
// worst), so the default of 2^20 subscription sets stays compact up to some
// 60M subscriptions at ~20 B each. Hashes stay listpacks up to 512 fields of
// at most 64 bytes: 2^18 row buckets keep rows compact up to ~100M rows.
// Rows wider than 64 bytes fall back to hashtable buckets, still ~20% smaller
// than a string key per row (whose key repeats the prefix); raising the
// server's hash-max-listpack-value to 256 saves another 27%. One set per FK
// is smaller at 15 subscriptions per FK (14.9 B against 20.3 B), but pays a
// key per distinct FK (~100 B, from the same figures), several times worse
// than a shared set for low fan-out joins, and gives no shard-level unit of
// atomicity for Cluster.
//
// # Redis Cluster
//
// On a *redis.ClusterClient the state is split into Config.Shards (64)
// shards: every data key carries the hash tag of its shard (bucket % shards),
// and the shards' tags are chosen so that their slots are spread evenly over
// 0..16383. The meta hash, the undo log and the redo record share the tag
// {<prefix>}. A write (Commit, CommitPartial, a recovery step, Init, a sweep
// step) commits in the meta slot first, with a new write id and a redo record
// of its commands per shard, then applies each shard's part with a script
// guarded by the shard's checkpoint key. A crash between two shards' commits
// is finished from the redo record by Resume (or the next write); a shard or
// a meta slot that a failover or a flush set back is reported as ErrLost.
// cluster.go has the protocol and its argument.
package redisstore
