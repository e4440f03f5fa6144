package cdc

import (
	"encoding/binary"
	"testing"
)

// FuzzDecode feeds arbitrary bytes to the decoder (without its panic guard)
// and, split into messages by 2-byte length prefixes, to the assembler: no
// input may panic.
func FuzzDecode(f *testing.F) {
	if msgs, err := readRecorded(capturedFile); err == nil {
		var all []byte
		for _, m := range msgs {
			f.Add(m.data)
			all = binary.BigEndian.AppendUint16(all, uint16(len(m.data)))
			all = append(all, m.data...)
		}
		f.Add(all)
	}
	f.Add(mkInsert(1, sp("1"), nil, sp("\x00u")))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = parseMessage(data, allocValues)
		a := newAssembler(3, 1<<10, discardLogger())
		for len(data) >= 2 {
			n := int(binary.BigEndian.Uint16(data))
			data = data[2:]
			if n > len(data) {
				n = len(data)
			}
			msg := data[:n]
			data = data[n:]
			_, _ = parseMessage(msg, allocValues)
			if _, err := a.handle(0x100, msg); err != nil {
				a.reset(0)
			}
		}
	})
}
