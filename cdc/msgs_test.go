package cdc

import (
	"encoding/binary"
	"io"
	"log/slog"

	"github.com/fkmat/fkmat/internal/wal"
)

// Builders of pgoutput protocol v1 messages for unit tests.

func be16(b []byte, v uint16) []byte { return binary.BigEndian.AppendUint16(b, v) }
func be32(b []byte, v uint32) []byte { return binary.BigEndian.AppendUint32(b, v) }
func be64(b []byte, v uint64) []byte { return binary.BigEndian.AppendUint64(b, v) }
func cstr(b []byte, s string) []byte { return append(append(b, s...), 0) }

func mkBegin(final wal.LSN, xid uint32) []byte {
	return be32(be64(be64([]byte{'B'}, uint64(final)), 0), xid)
}

func mkCommit(commit, end wal.LSN) []byte {
	return be64(be64(be64([]byte{'C', 0}, uint64(commit)), uint64(end)), 0)
}

type col struct {
	name string
	oid  uint32
	key  bool
}

func mkRelation(id uint32, name string, cols ...col) []byte {
	b := cstr(cstr(be32([]byte{'R'}, id), "public"), name)
	b = be16(append(b, 'd'), uint16(len(cols)))
	for _, c := range cols {
		flag := byte(0)
		if c.key {
			flag = 1
		}
		b = be32(be32(cstr(append(b, flag), c.name), c.oid), 0xffffffff)
	}
	return b
}

// tuple encodes values: nil is NULL, "\x00u" is unchanged TOAST.
func tuple(b []byte, vals ...*string) []byte {
	b = be16(b, uint16(len(vals)))
	for _, v := range vals {
		switch {
		case v == nil:
			b = append(b, 'n')
		case *v == "\x00u":
			b = append(b, 'u')
		default:
			b = append(be32(append(b, 't'), uint32(len(*v))), *v...)
		}
	}
	return b
}

func sp(s string) *string { return &s }

func mkInsert(relid uint32, vals ...*string) []byte {
	return tuple(append(be32([]byte{'I'}, relid), 'N'), vals...)
}

func mkTruncate(options byte, relids ...uint32) []byte {
	b := append(be32([]byte{'T'}, uint32(len(relids))), options)
	for _, id := range relids {
		b = be32(b, id)
	}
	return b
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
