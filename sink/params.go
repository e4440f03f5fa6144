package sink

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/cespare/xxhash/v2"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fkmat/fkmat/join"
)

// textOID and binaryFormat are what every parameter of the sink's
// statements is: text or text[], sent in Postgres' binary format.
const (
	textOID      = 25
	binaryFormat = 1
)

// params are one statement's parameters, encoded in Postgres' binary
// format into one buffer that is reused from statement to statement: a
// batch's rows cost a copy of their bytes, not a value per column (pgx's
// generic encoding boxes every non-NULL value and grows an array per
// column).
type params struct {
	buf []byte
	// ends[i] is where parameter i ends in buf; nulls[i] says it is NULL.
	ends    []int
	nulls   []bool
	values  [][]byte
	formats []int16
}

var paramsPool = sync.Pool{New: func() any { return new(params) }}

func getParams() *params { return paramsPool.Get().(*params) }

// release returns p to the pool, unless it grew past what is worth keeping.
func (p *params) release() {
	if cap(p.buf) > 16<<20 {
		return
	}
	p.buf, p.ends, p.nulls = p.buf[:0], p.ends[:0], p.nulls[:0]
	clear(p.values)
	p.values, p.formats = p.values[:0], p.formats[:0]
	paramsPool.Put(p)
}

func (p *params) end(null bool) {
	p.ends = append(p.ends, len(p.buf))
	p.nulls = append(p.nulls, null)
}

// keysAndValues appends the keys' first width values as text[]
// parameters (columns), then one text parameter per value (NULL kept).
func keysAndValues(p *params, keys [][]join.Value, width int, values []join.Value) error {
	if err := columns(p, keys, width); err != nil {
		return err
	}
	for i, v := range values {
		if v.Toast {
			return fmt.Errorf("value %d is an unchanged-TOAST marker", i)
		}
		p.buf = append(p.buf, v.Text...)
		p.end(v.Null)
	}
	return nil
}

// columns appends one text[] parameter per column of rows, the first width
// values of each row (NULL kept), in array_recv's format: dimensions, a
// NULL flag, the element type, then each element's length (-1 for NULL)
// and bytes.
func columns[R ~[]join.Value](p *params, rows []R, width int) error {
	for r, row := range rows {
		if len(row) < width {
			return fmt.Errorf("row %d has %d values, want %d", r, len(row), width)
		}
	}
	for c := range width {
		head := len(p.buf)
		p.buf = binary.BigEndian.AppendUint32(p.buf, 1) // dimensions
		p.buf = binary.BigEndian.AppendUint32(p.buf, 0) // has NULLs, set below
		p.buf = binary.BigEndian.AppendUint32(p.buf, textOID)
		p.buf = binary.BigEndian.AppendUint32(p.buf, uint32(len(rows)))
		p.buf = binary.BigEndian.AppendUint32(p.buf, 1) // lower bound
		nulls := false
		for r := range rows {
			v := &rows[r][c]
			switch {
			case v.Toast:
				return fmt.Errorf("row %d column %d: unchanged-TOAST marker reached the sink", r, c)
			case v.Null:
				nulls = true
				p.buf = binary.BigEndian.AppendUint32(p.buf, 0xFFFFFFFF)
			default:
				p.buf = binary.BigEndian.AppendUint32(p.buf, uint32(len(v.Text)))
				p.buf = append(p.buf, v.Text...)
			}
		}
		if nulls {
			binary.BigEndian.PutUint32(p.buf[head+4:], 1)
		}
		p.end(false)
	}
	return nil
}

// slices cuts the buffer into the parameters, once all are encoded (the
// buffer may move while it grows).
func (p *params) slices() {
	start := 0
	for i, end := range p.ends {
		var v []byte
		if !p.nulls[i] {
			v = p.buf[start:end:end]
		}
		p.values = append(p.values, v)
		p.formats = append(p.formats, binaryFormat)
		start = end
	}
}

// exec runs sql, with the parameters fill encodes, on the transaction's
// connection as a prepared statement named after its text (pgx keeps it
// prepared on the connection, as it does for its own statement cache),
// and returns the rows it affected.
func (t *Tx) exec(ctx context.Context, sql string, fill func(*params) error) (int64, error) {
	p := getParams()
	defer p.release()
	if err := fill(p); err != nil {
		return 0, err
	}
	p.slices()
	conn := t.tx.Conn()
	sd, err := conn.Prepare(ctx, statementName(sql), sql)
	if err != nil {
		return 0, err
	}
	lendWire(conn.PgConn(), len(p.buf)+6*len(p.values)+len(sd.Name)+64)
	tag, err := conn.PgConn().ExecStatement(ctx, sd, p.values, p.formats, nil).Close()
	return tag.RowsAffected(), err
}

// wireKey names, in a connection's custom data, the buffer its frontend
// encodes the sink's statements into.
const wireKey = "fkmat.wire"

// maxWire bounds the buffer a connection keeps.
const maxWire = 16 << 20

// lendWire makes the connection's frontend encode its next messages into a
// buffer of at least need bytes that the connection keeps from statement
// to statement. The frontend's own buffer holds 1 KB and is dropped after
// each message that outgrew it, so a statement of a batch's rows was
// copied into a buffer grown from 1 KB and thrown away (twice its bytes
// allocated per statement). The frontend takes whatever buffer a message's
// Encode returns; lend's returns this one, with the pending bytes copied
// in. After its flush the frontend goes back to a small buffer of its own,
// or keeps this one, which only this connection uses.
func lendWire(conn *pgconn.PgConn, need int) {
	if need > maxWire {
		return
	}
	data := conn.CustomData()
	buf, _ := data[wireKey].([]byte)
	if cap(buf) < need {
		buf = make([]byte, 0, need+need/4)
		data[wireKey] = buf
	}
	conn.Frontend().Send(lend(buf))
}

// lend is a message of no bytes that moves the frontend's pending bytes
// into its own buffer (see lendWire).
type lend []byte

func (lend) Frontend() {}

func (lend) Decode([]byte) error { return errors.New("sink: lend is not a wire message") }

func (l lend) Encode(dst []byte) ([]byte, error) { return append(l[:0], dst...), nil }

// statementName names a statement by its text.
func statementName(sql string) string {
	return "fkmat_" + strconv.FormatUint(xxhash.Sum64String(sql), 36)
}
