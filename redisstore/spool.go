package redisstore

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"

	"github.com/fkmat/fkmat/join"
)

// A Spool is the backfill's path into a fresh state: it gathers every row
// and subscription of a table before it writes any, so that each key is
// written once, whatever the order the table is read in: whole, with one
// RESTORE of its listpack (listpack.go), or, beyond the listpack limits or
// on a server that refuses RESTORE, with one multi-field HSET or ZADD per
// page. A Loader groups only
// what it gathers in a few MiB; on a table whose state has tens of
// thousands of keys that is about one entry per command, and Redis, whose
// one thread is the backfill's bound, spends most of its time per command,
// not per entry.
//
// Entries are spread over partitions by key (a key's entries all land in
// one), each partition gathered in memory in chunks that go to one
// temporary file once full. Load then reads the partitions two at a time,
// sorts each by key and writes it. Memory is bounded by the chunks in
// memory plus the partitions being written (spoolMergeBytes in the whole
// process); the temporary file holds the encoded state, about the size it
// takes in Redis, and is unlinked as soon as it is created, so nothing is
// left behind whatever stops the process.
type Spool struct {
	s    *Store
	meta Meta
	file *os.File
	// end is the size of file: chunks are appended at end by WriteAt.
	end   atomic.Int64
	parts []spoolPart
	// chunk is the size at which a partition's gathered bytes go to file.
	chunk int
	// merge bounds the bytes of one partition sorted and written at once
	// (spoolMergeBytes).
	merge int64
	// limits are the listpack limits of the keys written whole, in
	// payloads of RDB version rdbVersion; noRestore is set when the server
	// is older than RestoreVersion, or once it refused a RESTORE.
	limits     listpackLimits
	rdbVersion uint16
	noRestore  atomic.Bool
	// commands and entries count the commands sent and the rows and
	// subscriptions they carried.
	commands, entries atomic.Int64
}

// spoolPart is one partition: the chunks it wrote to the file, and the
// bytes it gathers in memory.
type spoolPart struct {
	mu     sync.Mutex
	chunks []spoolChunk
	buf    []byte
	// count is the entries in buf.
	count int
}

// spoolChunk is n bytes at off in the file (off -1: a partition's bytes in
// memory) holding count entries.
type spoolChunk struct{ off, n, count int64 }

// spoolRowsPerPart is the number of table rows per partition: about 2 MiB
// of encoded state for rows of the usual widths with a few references.
// Entries are read in key order once sorted, so a partition that stays in
// the processor's cache is written faster (W7: a tenth less of fkmat's CPU
// than with 16 MiB); the grouping is the same, since every entry of a key
// is in one partition whatever their number.
const spoolRowsPerPart = 8 << 10

// spoolMaxParts bounds a spool's partitions, and with spoolMemoryBytes the
// memory and the writes to its file: a table of 10^8 rows has partitions
// of some 25 MiB.
const spoolMaxParts = 1024

// spoolMemoryBytes bounds the bytes a spool gathers in memory, over all
// its partitions, before they go to its file (four times as much with
// spoolMaxParts partitions: a chunk is at least 16 KiB).
const spoolMemoryBytes = 4 << 20

// spoolMergeBytes bounds the bytes of partitions being sorted and written
// at once in the whole process, whatever the number of spools: a
// partition larger than it (a table much larger than estimated) is written
// in parts of that size, grouped within each.
const spoolMergeBytes = 32 << 20

var spoolMerge = semaphore.NewWeighted(spoolMergeBytes)

// NewSpool returns a spool for the state, which must be freshly initialised
// (no checkpoint, no transaction in flight), for a table of about rows rows.
// Its temporary file is created in dir (os.TempDir() when empty). Close
// releases it.
func (s *Store) NewSpool(ctx context.Context, dir string, rows int64) (*Spool, error) {
	cur, err := s.current(ctx)
	if err != nil {
		return nil, fmt.Errorf("load redis state: %w", err)
	}
	if cur.Checkpoint != 0 || cur.InFlight != 0 {
		return nil, errors.New("load redis state: the state is not freshly initialised; call Init first")
	}
	f, err := os.CreateTemp(dir, "fkmat-backfill-*")
	if err != nil {
		return nil, fmt.Errorf("load redis state: a temporary file for the backfill: %w", err)
	}
	if err := os.Remove(f.Name()); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("load redis state: unlink the backfill's temporary file: %w", err)
	}
	n := int(min(max(rows/spoolRowsPerPart, 1), spoolMaxParts))
	sp := &Spool{s: s, meta: cur, file: f, parts: make([]spoolPart, n), limits: defaultListpackLimits,
		rdbVersion: cmp.Or(s.dumpVersion, rdbVersion), chunk: max(spoolMemoryBytes/n, 16<<10), merge: spoolMergeBytes}
	// A server before 7.0 cannot read listpack payloads (RDB 10): every
	// key goes by HSET or ZADD. One that does not say its version is
	// tried, and a refusal falls back the same way (exec).
	if v, err := ServerVersion(ctx, s.rdb); err == nil && v.Before(RestoreVersion) {
		sp.noRestore.Store(true)
	}
	return sp, nil
}

// Close releases the spool's temporary file.
func (sp *Spool) Close() error { return sp.file.Close() }

// Add gathers the puts and subscription adds of m. It refuses clears and
// deletes. Several goroutines may add at once.
func (sp *Spool) Add(_ context.Context, m join.Mutations) error {
	return loadEntries(m, sp.meta.Shape, sp.gather)
}

// gather appends one entry to its key's partition: a row (field, value) or
// a subscription (its member in value).
func (sp *Spool) gather(kind byte, shard uint64, field string, value []byte) error {
	p := &sp.parts[((shard<<8|uint64(kind))*0x9E3779B97F4A7C15>>32)%uint64(len(sp.parts))]
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, kind)
	p.buf = binary.AppendUvarint(p.buf, shard)
	p.buf = binary.AppendUvarint(p.buf, uint64(len(field)))
	p.buf = append(p.buf, field...)
	p.buf = binary.AppendUvarint(p.buf, uint64(len(value)))
	p.buf = append(p.buf, value...)
	p.count++
	if len(p.buf) < sp.chunk {
		return nil
	}
	off := sp.end.Add(int64(len(p.buf))) - int64(len(p.buf))
	if _, err := sp.file.WriteAt(p.buf, off); err != nil {
		return fmt.Errorf("load redis state: write the backfill's temporary file: %w", err)
	}
	p.chunks = append(p.chunks, spoolChunk{off, int64(len(p.buf)), int64(p.count)})
	p.buf, p.count = p.buf[:0], 0
	return nil
}

// Load writes everything the spool gathered, a partition at a time, each
// sorted by key: a key within Redis's listpack limits with one RESTORE of
// its listpack, any other with one HSET or ZADD per page of the store's
// page size. No Add may run during or after it.
func (sp *Spool) Load(ctx context.Context) error {
	defer sp.s.right.drop() // written outside Commit: the cache must not keep older rows
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(2) // one partition sorted while another is written
	for i := range sp.parts {
		p := &sp.parts[i]
		// Parts of at most sp.merge bytes: usually the whole partition.
		var part []spoolChunk
		var size int64
		for _, c := range append(p.chunks, spoolChunk{-1, int64(len(p.buf)), int64(p.count)}) {
			if len(part) > 0 && size+c.n > sp.merge {
				chunks, n := part, size
				g.Go(func() error { return sp.write(gctx, p, chunks, n, false) })
				part, size = nil, 0
			}
			part, size = append(part, c), size+c.n
		}
		whole := len(part) == len(p.chunks)+1
		g.Go(func() error { return sp.write(gctx, p, part, size, whole) })
	}
	return g.Wait()
}

// spoolEntry is one gathered entry of a part: its key (kind<<56 | shard)
// and where it starts in the part's bytes.
type spoolEntry struct {
	key uint64
	off uint32
}

// write reads chunks of p, sorts their entries by key and writes them,
// grouped. whole says the chunks are all of p's, so that a key can be
// written whole.
func (sp *Spool) write(ctx context.Context, p *spoolPart, chunks []spoolChunk, size int64, whole bool) error {
	if size == 0 {
		return nil
	}
	weight := min(2*size, spoolMergeBytes) // its bytes, and sorted
	if err := spoolMerge.Acquire(ctx, weight); err != nil {
		return err
	}
	defer spoolMerge.Release(weight)
	b := make([]byte, 0, size)
	var count int64
	for _, c := range chunks {
		count += c.count
		if c.off < 0 {
			b = append(b, p.buf...)
			continue
		}
		b = b[:len(b)+int(c.n)]
		if _, err := sp.file.ReadAt(b[len(b)-int(c.n):], c.off); err != nil {
			return fmt.Errorf("load redis state: read the backfill's temporary file: %w", err)
		}
	}
	b, entries, err := spoolSort(b, count)
	if err != nil {
		return err
	}
	// The payloads are flushed at about 1 MiB: room for that from the
	// start, not grown by doubling in every part (a fifth of a roll-up's
	// backfill allocations).
	w := spoolWriter{sp: sp, ctx: ctx, b: b, pipe: sp.s.rdb.Pipeline(), payloads: make([]byte, 0, min(size+size/4, 1<<20+1<<18))}
	for start := 0; start < len(entries); {
		end := start + 1
		for end < len(entries) && entries[end].key == entries[start].key {
			end++
		}
		if err := w.key(entries[start:end], whole); err != nil {
			return err
		}
		start = end
	}
	return w.exec()
}

// spoolWriter writes the keys of one part through a pipeline.
type spoolWriter struct {
	sp   *Spool
	ctx  context.Context
	b    []byte
	pipe redis.Pipeliner
	// pending is the bytes in pipe, subs its new subscriptions.
	pending, subs int
	// restores are the RESTOREs in pipe, with their keys' entries, for
	// the fall back to HSET and ZADD.
	restores []spoolRestore
	lp       listpack
	payloads []byte
	// elems are the entries of the key being encoded as a listpack.
	elems []spoolElem
}

// spoolElem is an entry decoded: its field and value, and the one of them
// it is ordered by (the field of a row, the member of a subscription).
type spoolElem struct{ elem, field, value string }

// spoolRestore is a RESTORE in a pipeline: the key's entries, and the
// subscriptions it adds (0 for rows).
type spoolRestore struct {
	cmd  *redis.StatusCmd
	run  []spoolEntry
	subs int
}

// key writes the entries of one key (run), whole with RESTORE when it can.
func (w *spoolWriter) key(run []spoolEntry, whole bool) error {
	sp := w.sp
	kind, shard := byte(run[0].key>>56), run[0].key&(1<<56-1)
	if whole && !sp.noRestore.Load() {
		if payload, n, ok := w.listpack(kind, run); ok {
			cmd := w.pipe.Restore(w.ctx, sp.s.keys.name(kind, sp.meta.gen(kind), shard), 0, payload)
			r := spoolRestore{cmd: cmd, run: run}
			if kind == kindSubs {
				r.subs = n
				w.subs += n
			}
			w.restores = append(w.restores, r)
			sp.commands.Add(1)
			sp.entries.Add(int64(len(run)))
			return w.flushFull(len(payload))
		}
	}
	return w.commands(run)
}

// commands writes the entries of one key (run) with HSET or ZADD, a page
// at a time.
func (w *spoolWriter) commands(run []spoolEntry) error {
	sp := w.sp
	kind, shard := byte(run[0].key>>56), run[0].key&(1<<56-1)
	key := sp.s.keys.name(kind, sp.meta.gen(kind), shard)
	page := sp.s.cfg.PageSize
	if kind != kindSubs {
		// In the order gathered, so that of a row spooled twice the last
		// one stays (spoolSort does not keep that order).
		slices.SortFunc(run, func(a, b spoolEntry) int { return cmp.Compare(a.off, b.off) })
	}
	for start := 0; start < len(run); start += page {
		chunk := run[start:min(start+page, len(run))]
		_, n := queueEntries(w.ctx, w.pipe, key, kind, len(chunk), page, func(i int) (string, string) { return spoolEntryAt(w.b, chunk[i].off) })
		if kind == kindSubs {
			w.subs += len(chunk)
		}
		sp.commands.Add(1)
		sp.entries.Add(int64(len(chunk)))
		if err := w.flushFull(n); err != nil {
			return err
		}
	}
	return nil
}

// listpack returns the RESTORE payload of the key of kind holding run and
// the number of its elements, or false when the key is not one Redis keeps
// as a listpack (too many entries, a value too long) or holds a field
// twice: such a key is written with HSET or ZADD.
func (w *spoolWriter) listpack(kind byte, run []spoolEntry) (string, int, bool) {
	lim := w.sp.limits
	entries, value := lim.hashEntries, lim.hashValue
	if kind == kindSubs {
		entries, value = lim.zsetEntries, lim.zsetValue
	}
	if len(run) > entries {
		return "", 0, false
	}
	// Fields (hashes) and members (sets) in order: Redis keeps a set's
	// members sorted, and a field given twice is found. Each entry is
	// decoded once, not at each comparison.
	w.elems = w.elems[:0]
	ordered := true
	for _, e := range run {
		field, val := spoolEntryAt(w.b, e.off)
		el := spoolElem{elem: field, field: field, value: val}
		if kind == kindSubs {
			el.elem = val
		}
		if n := len(w.elems); n > 0 && w.elems[n-1].elem > el.elem {
			ordered = false
		}
		w.elems = append(w.elems, el)
	}
	if !ordered {
		slices.SortFunc(w.elems, func(a, b spoolElem) int { return strings.Compare(a.elem, b.elem) })
	}
	w.lp.reset()
	typ := byte(rdbTypeHashListpack)
	if kind == kindSubs {
		typ = rdbTypeZsetListpack
	}
	for i, e := range w.elems {
		if i > 0 && w.elems[i-1].elem == e.elem {
			if kind != kindSubs {
				return "", 0, false // HSET keeps one of them
			}
			continue // a member added twice is one member
		}
		if len(e.field) > value || len(e.value) > value {
			return "", 0, false
		}
		if kind == kindSubs {
			w.lp.add(e.value)
			w.lp.add("0")
		} else {
			w.lp.add(e.field)
			w.lp.add(e.value)
		}
	}
	n := w.lp.n / 2 // rows, or members
	start := len(w.payloads)
	w.payloads = appendDumpPayload(w.payloads, typ, w.lp.bytes(), w.sp.rdbVersion)
	// The payloads stay unchanged until the pipeline has run (an append
	// that grows w.payloads leaves the old array as it was; exec reuses it
	// once the pipeline ran).
	p := w.payloads[start:]
	return unsafe.String(unsafe.SliceData(p), len(p)), n, true
}

// flushFull runs the pipeline once it holds about 1 MiB.
func (w *spoolWriter) flushFull(n int) error {
	w.pending += n
	if w.pending < 1<<20 {
		return nil
	}
	return w.exec()
}

// exec runs the pipeline. A RESTORE the server refuses (a payload of an RDB
// version newer than the server's, a user without the permission, a key
// that exists already) is written again with HSET or ZADD, and a refusal
// of the payload or the command stops the spool from trying RESTORE
// again.
func (w *spoolWriter) exec() error {
	if w.pending == 0 && len(w.restores) == 0 {
		return nil
	}
	if w.subs > 0 {
		// Loaded rows have distinct keys, so every add is a new member.
		w.pipe.HIncrBy(w.ctx, w.sp.s.keys.meta(), fieldSubs, int64(w.subs))
	}
	_, err := w.pipe.Exec(w.ctx)
	restores := w.restores
	// The pipeline ran: nothing refers to the payloads any more, and the
	// next ones are encoded into the same memory.
	w.pending, w.subs, w.restores, w.payloads = 0, 0, w.restores[:0], w.payloads[:0]
	if err == nil {
		return nil
	}
	var again [][]spoolEntry
	for _, r := range restores {
		rerr := r.cmd.Err()
		if rerr == nil {
			continue
		}
		msg := rerr.Error()
		switch {
		case strings.HasPrefix(msg, "BUSYKEY"):
		case strings.HasPrefix(msg, "NOPERM"), strings.Contains(msg, "unknown command"),
			strings.Contains(msg, "Bad data format"), strings.Contains(msg, "payload version or checksum"):
			w.sp.noRestore.Store(true)
		default:
			return fmt.Errorf("load redis state: %w", rerr)
		}
		if r.subs > 0 {
			// Counted again by the ZADDs; the HINCRBY above ran.
			w.pipe.HIncrBy(w.ctx, w.sp.s.keys.meta(), fieldSubs, -int64(r.subs))
		}
		w.sp.entries.Add(-int64(len(r.run))) // carried by the commands
		again = append(again, r.run)
	}
	if len(again) == 0 {
		return fmt.Errorf("load redis state: %w", err)
	}
	for _, run := range again {
		if err := w.commands(run); err != nil {
			return err
		}
	}
	return w.exec()
}

// spoolClusterBytes is the size of the clusters spoolSort sorts one at a
// time: about what a core's cache holds.
const spoolClusterBytes = 128 << 10

// spoolSort returns the count entries encoded in b ordered by key, each
// one's off pointing into the bytes returned with them. Sorting an index
// of a few MiB and reading the entries in its order misses the cache at
// every entry (a third of the write's time in W7), so the entries are
// first moved, reading b in order, into clusters of spoolClusterBytes by a
// hash of their key, and each cluster is sorted on its own. The keys of a
// cluster differ from those of the others, so the entries of a key still
// come out together.
func spoolSort(b []byte, count int64) ([]byte, []spoolEntry, error) {
	entries := make([]spoolEntry, 0, count)
	for e, err := range spoolEntries(b) {
		if err != nil {
			return nil, nil, err
		}
		entries = append(entries, spoolEntry{key: uint64(e.kind)<<56 | e.shard, off: e.off})
	}
	byKey := func(a, b spoolEntry) int { return cmp.Compare(a.key, b.key) }
	m := uint64(len(b)/spoolClusterBytes + 1)
	if m == 1 {
		slices.SortFunc(entries, byKey)
		return b, entries, nil
	}
	cluster := func(key uint64) uint64 { return (key * 0x9E3779B97F4A7C15 >> 32) % m }
	end := func(i int) uint32 {
		if i+1 < len(entries) {
			return entries[i+1].off
		}
		return uint32(len(b))
	}
	// Where each cluster's bytes and entries start.
	bytes, counts := make([]uint32, m+1), make([]uint32, m+1)
	for i, e := range entries {
		c := cluster(e.key)
		bytes[c+1] += end(i) - e.off
		counts[c+1]++
	}
	for c := range m {
		bytes[c+1] += bytes[c]
		counts[c+1] += counts[c]
	}
	sorted, moved := make([]byte, len(b)), make([]spoolEntry, len(entries))
	for i, e := range entries {
		c := cluster(e.key)
		n := copy(sorted[bytes[c]:], b[e.off:end(i)])
		moved[counts[c]] = spoolEntry{key: e.key, off: bytes[c]}
		bytes[c] += uint32(n)
		counts[c]++
	}
	// counts[c] is now where cluster c+1 starts.
	start := uint32(0)
	for c := range m {
		slices.SortFunc(moved[start:counts[c]], byKey)
		start = counts[c]
	}
	return sorted, moved, nil
}

// spoolHeader is an entry's key and where it starts.
type spoolHeader struct {
	kind  byte
	shard uint64
	off   uint32
}

var errSpoolCorrupt = errors.New("load redis state: the backfill's temporary file is corrupt")

// spoolEntries yields the entries encoded in b, each one a kind, a uvarint
// shard, a uvarint field length and the field, a uvarint value length and
// the value; and an error if b is not such a sequence.
func spoolEntries(b []byte) func(yield func(spoolHeader, error) bool) {
	return func(yield func(spoolHeader, error) bool) {
		for i := 0; i < len(b); {
			h := spoolHeader{kind: b[i], off: uint32(i)}
			shard, n := binary.Uvarint(b[i+1:])
			if n <= 0 {
				yield(h, errSpoolCorrupt)
				return
			}
			h.shard = shard
			end, ok := spoolSkip(b, i+1+n)
			if ok {
				end, ok = spoolSkip(b, end)
			}
			if !ok {
				yield(h, errSpoolCorrupt)
				return
			}
			if !yield(h, nil) {
				return
			}
			i = end
		}
	}
}

// spoolSkip returns the end of the length-prefixed bytes at i in b, and
// false when they run past b.
func spoolSkip(b []byte, i int) (int, bool) {
	l, n := binary.Uvarint(b[i:])
	if n <= 0 || uint64(len(b)-i-n) < l {
		return 0, false
	}
	return i + n + int(l), true
}

// spoolEntryAt returns the field and the value of the entry at off in b,
// which spoolEntries has checked. They share b's memory, which stays
// unchanged until the pipeline that sends them has run: a string per
// entry would copy the whole state once more.
func spoolEntryAt(b []byte, off uint32) (field, value string) {
	i := int(off) + 1
	_, n := binary.Uvarint(b[i:])
	i += n
	l, n := binary.Uvarint(b[i:])
	i += n
	field = unsafe.String(unsafe.SliceData(b[i:]), int(l))
	i += int(l)
	l, n = binary.Uvarint(b[i:])
	i += n
	value = unsafe.String(unsafe.SliceData(b[i:]), int(l))
	return field, value
}

// FileBytes returns the bytes the spool wrote to its temporary file.
func (sp *Spool) FileBytes() int64 { return sp.end.Load() }

// Counts returns the commands sent and the rows and subscriptions they
// carried.
func (sp *Spool) Counts() (commands, entries int64) { return sp.commands.Load(), sp.entries.Load() }
