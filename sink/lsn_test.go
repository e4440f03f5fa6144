package sink_test

import "github.com/jackc/pglogrepl"

func pglsn(n uint64) pglogrepl.LSN { return pglogrepl.LSN(n) }
