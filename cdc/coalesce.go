package cdc

import (
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// The replication stream's reads are coalesced: while it keeps up with the
// walsender, which sends each message as it decodes it, a reader would
// otherwise take one message per system call, and park and wake for each
// (under pgbench's TPC-B, two fifths of fkmat's CPU). After a read that
// found less than coalesceBelow bytes, the next read waits coalesceGap
// first, so that it finds the messages of that time at once. A stream
// that is behind finds more than that in each read and never waits.
const (
	coalesceBelow = 16 << 10
	coalesceGap   = time.Millisecond
	coalesceBuf   = 256 << 10
)

// coalescingReader reads its source in large reads into a buffer of its
// own, waiting coalesceGap before a read when the last one was small.
type coalescingReader struct {
	r          io.Reader
	buf        []byte
	start, end int
	err        error // a read's error, returned once its data is
	small      bool  // the last read found less than coalesceBelow bytes
	sleep      func(time.Duration)
}

func newCoalescingReader(r io.Reader) *coalescingReader {
	return &coalescingReader{r: r, sleep: time.Sleep}
}

func (c *coalescingReader) Read(p []byte) (int, error) {
	if c.start == c.end {
		if c.err != nil {
			err := c.err
			c.err = nil
			return 0, err
		}
		if c.buf == nil {
			c.buf = make([]byte, coalesceBuf)
		}
		if c.small {
			c.sleep(coalesceGap)
		}
		n, err := c.r.Read(c.buf)
		c.small = n > 0 && n < coalesceBelow
		c.start, c.end = 0, n
		if n == 0 {
			return 0, err
		}
		c.err = err
	}
	n := copy(p, c.buf[c.start:c.end])
	c.start += n
	return n, nil
}

// coalescingFrontend builds a connection's frontend on a coalescingReader
// (pgconn.Config.BuildFrontend).
func coalescingFrontend(r io.Reader, w io.Writer) *pgproto3.Frontend {
	return pgproto3.NewFrontend(newCoalescingReader(r), w)
}
