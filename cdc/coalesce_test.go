package cdc

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"
)

// chunks is a reader that returns its chunks one per Read, then err.
type chunks struct {
	parts [][]byte
	err   error
}

func (c *chunks) Read(p []byte) (int, error) {
	if len(c.parts) == 0 {
		return 0, c.err
	}
	n := copy(p, c.parts[0])
	if c.parts[0] = c.parts[0][n:]; len(c.parts[0]) == 0 {
		c.parts = c.parts[1:]
	}
	if len(c.parts) == 0 {
		return n, c.err // data and the error at once
	}
	return n, nil
}

// TestCoalescingReader: every byte arrives once and in order through reads
// of any size; a read waits only after a small read; an error that came
// with data is returned after the data, once.
func TestCoalescingReader(t *testing.T) {
	big := bytes.Repeat([]byte("b"), coalesceBelow+10)
	src := &chunks{parts: [][]byte{[]byte("ab"), []byte("cde"), big, []byte("f")}, err: io.ErrUnexpectedEOF}
	c := newCoalescingReader(src)
	var slept []int
	reads := 0
	c.sleep = func(d time.Duration) {
		if d != coalesceGap {
			t.Fatalf("slept %s, want %s", d, coalesceGap)
		}
		slept = append(slept, reads)
	}
	var got []byte
	p := make([]byte, 3)
	var err error
	for {
		var n int
		n, err = c.Read(p)
		reads++
		got = append(got, p[:n]...)
		if err != nil {
			break
		}
	}
	want := append(append([]byte("abcde"), big...), 'f')
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, want %d, or out of order", len(got), len(want))
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("error %v, want the source's", err)
	}
	// Fills: "ab" (small), then wait; "cde" (small), then wait; the big
	// part (not small): no wait before "f".
	if len(slept) != 2 {
		t.Fatalf("waited %d times (before reads %v), want 2: after each small fill only", len(slept), slept)
	}
	if n, err := c.Read(p); n != 0 || err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("after the error: %d, %v", n, err)
	}
}
