package redisstore

import (
	"encoding/binary"
	"math/bits"
	"strconv"
)

// A backfill writes most keys whole with RESTORE: the key's listpack, built
// here as Redis builds it with HSET or ZADD, in the payload DUMP gives. Redis
// then copies the payload instead of searching the key's listpack once per
// field (HSET) or twice per member (ZADD), which made it the bound of a
// backfill. The formats are Redis's own (listpack.c, rdb.c, cluster.c):
//
//	payload:  type byte, RDB string of the listpack, RDB version (2 bytes
//	          LE), CRC-64/Jones of all before (8 bytes LE)
//	listpack: total bytes (4 LE), elements (2 LE), entries, 0xFF
//	entry:    encoding and data, then their length backwards (1-5 bytes)
//
// A string that is a canonical int64 is stored as an integer, as Redis does,
// so that the listpack is byte for byte what HSET or ZADD would have made
// (TestDumpPayload compares them with DUMP). Types 16 and 17 came with RDB
// version 10 (Redis 7.0); an older server refuses the payload and the
// backfill falls back to HSET and ZADD.
const (
	rdbTypeHashListpack = 16
	rdbTypeZsetListpack = 17
	rdbVersion          = 10
)

// listpack builds one listpack.
type listpack struct {
	b []byte
	n int
}

func (lp *listpack) reset() {
	lp.b = append(lp.b[:0], 0, 0, 0, 0, 0, 0)
	lp.n = 0
}

// add appends the element s.
func (lp *listpack) add(s string) {
	start := len(lp.b)
	if v, ok := listpackInt(s); ok {
		lp.b = appendListpackInt(lp.b, v)
	} else {
		switch n := len(s); {
		case n < 64:
			lp.b = append(lp.b, 0x80|byte(n))
		case n < 4096:
			lp.b = append(lp.b, 0xE0|byte(n>>8), byte(n))
		default:
			lp.b = append(lp.b, 0xF0)
			lp.b = binary.LittleEndian.AppendUint32(lp.b, uint32(n))
		}
		lp.b = append(lp.b, s...)
	}
	lp.b = appendBacklen(lp.b, uint64(len(lp.b)-start))
	lp.n++
}

// bytes ends the listpack and returns it.
func (lp *listpack) bytes() []byte {
	lp.b = append(lp.b, 0xFF)
	binary.LittleEndian.PutUint32(lp.b, uint32(len(lp.b)))
	binary.LittleEndian.PutUint16(lp.b[4:], uint16(min(lp.n, 65535))) // 65535: count unknown
	return lp.b
}

// listpackInt reports whether s is an int64 in its canonical decimal form,
// which a listpack stores as an integer (lpStringToInt64).
func listpackInt(s string) (int64, bool) {
	if len(s) == 0 || len(s) > 20 || (s[0] != '-' && (s[0] < '0' || s[0] > '9')) {
		return 0, false
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || strconv.FormatInt(v, 10) != s {
		return 0, false
	}
	return v, true
}

// appendListpackInt appends the smallest integer encoding of v
// (lpEncodeIntegerGetType).
func appendListpackInt(b []byte, v int64) []byte {
	switch {
	case v >= 0 && v <= 127:
		return append(b, byte(v))
	case v >= -4096 && v <= 4095:
		u := uint64(v) & (1<<13 - 1)
		return append(b, 0xC0|byte(u>>8), byte(u))
	case v >= -32768 && v <= 32767:
		return binary.LittleEndian.AppendUint16(append(b, 0xF1), uint16(v))
	case v >= -8388608 && v <= 8388607:
		u := uint32(v)
		return append(b, 0xF2, byte(u), byte(u>>8), byte(u>>16))
	case v >= -2147483648 && v <= 2147483647:
		return binary.LittleEndian.AppendUint32(append(b, 0xF3), uint32(v))
	default:
		return binary.LittleEndian.AppendUint64(append(b, 0xF4), uint64(v))
	}
}

// appendBacklen appends the length l of the entry before, backwards
// (lpEncodeBacklen).
func appendBacklen(b []byte, l uint64) []byte {
	switch {
	case l <= 127:
		return append(b, byte(l))
	case l < 16383:
		return append(b, byte(l>>7), byte(l&127)|128)
	case l < 2097151:
		return append(b, byte(l>>14), byte((l>>7)&127)|128, byte(l&127)|128)
	case l < 268435455:
		return append(b, byte(l>>21), byte((l>>14)&127)|128, byte((l>>7)&127)|128, byte(l&127)|128)
	default:
		return append(b, byte(l>>28), byte((l>>21)&127)|128, byte((l>>14)&127)|128, byte((l>>7)&127)|128, byte(l&127)|128)
	}
}

// appendDumpPayload appends the RESTORE payload of an object of type typ
// encoded as lp.
func appendDumpPayload(b []byte, typ byte, lp []byte, version uint16) []byte {
	start := len(b)
	b = append(b, typ)
	switch n := uint64(len(lp)); {
	case n < 1<<6:
		b = append(b, byte(n))
	case n < 1<<14:
		b = append(b, 0x40|byte(n>>8), byte(n))
	case n <= 1<<32-1:
		b = binary.BigEndian.AppendUint32(append(b, 0x80), uint32(n))
	default:
		b = binary.BigEndian.AppendUint64(append(b, 0x81), n)
	}
	b = append(b, lp...)
	b = binary.LittleEndian.AppendUint16(b, version)
	return binary.LittleEndian.AppendUint64(b, crc64Jones(b[start:]))
}

// crc64Jones is Redis's CRC-64 (crc64.c: polynomial 0xad93d23594c935a9,
// reflected, no initial or final xor), by slicing 8 bytes at a time.
func crc64Jones(p []byte) uint64 {
	var crc uint64
	t := &crc64Tables
	for len(p) >= 8 {
		crc ^= binary.LittleEndian.Uint64(p)
		crc = t[7][crc&0xff] ^ t[6][(crc>>8)&0xff] ^ t[5][(crc>>16)&0xff] ^ t[4][(crc>>24)&0xff] ^
			t[3][(crc>>32)&0xff] ^ t[2][(crc>>40)&0xff] ^ t[1][(crc>>48)&0xff] ^ t[0][crc>>56]
		p = p[8:]
	}
	for _, c := range p {
		crc = t[0][byte(crc)^c] ^ crc>>8
	}
	return crc
}

var crc64Tables = func() (t [8][256]uint64) {
	poly := bits.Reverse64(0xad93d23594c935a9)
	for i := range 256 {
		crc := uint64(i)
		for range 8 {
			if crc&1 == 1 {
				crc = crc>>1 ^ poly
			} else {
				crc >>= 1
			}
		}
		t[0][i] = crc
	}
	for i := range 256 {
		crc := t[0][i]
		for k := 1; k < 8; k++ {
			crc = t[0][crc&0xff] ^ crc>>8
			t[k][i] = crc
		}
	}
	return t
}()

// listpackLimits are the largest hashes and sorted sets a server keeps as
// listpacks (hash-max-listpack-entries and -value, zset-max-listpack-*).
type listpackLimits struct {
	hashEntries, hashValue, zsetEntries, zsetValue int
}

// defaultListpackLimits are Redis's defaults. fkmat does not read the
// server's (CONFIG GET needs a permission that also reads its passwords):
// a key within them is what HSET or ZADD makes on a server with the
// defaults or higher limits; a server with lower ones converts a key with
// more entries on RESTORE, and keeps a longer value in a listpack, which
// only costs that key's reads. Keys beyond them are written with HSET and
// ZADD.
var defaultListpackLimits = listpackLimits{hashEntries: 128, hashValue: 64, zsetEntries: 128, zsetValue: 64}
