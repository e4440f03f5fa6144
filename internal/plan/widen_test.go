package plan

import (
	"testing"

	"github.com/fkmat/fkmat/sink"
)

func col(oid uint32, typmod int32) SourceColumn { return SourceColumn{TypeOID: oid, TypeMod: typmod} }

// numeric(p,s)'s typmod.
func numeric(p, s int32) int32 { return (p<<16 | s) + 4 }

// TestWidens: the type changes every value survives, as text too for keys,
// and the others.
func TestWidens(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		from, to SourceColumn
		key      bool
		want     bool
	}{
		{"int to bigint", col(oidInt4, -1), col(oidInt8, -1), true, true},
		{"smallint to int", col(oidInt2, -1), col(oidInt4, -1), true, true},
		{"smallint to bigint", col(oidInt2, -1), col(oidInt8, -1), false, true},
		{"bigint to int", col(oidInt8, -1), col(oidInt4, -1), false, false},
		{"int to text", col(oidInt4, -1), col(oidText, -1), false, false},
		{"varchar(10) to varchar(20)", col(oidVarchar, 14), col(oidVarchar, 24), true, true},
		{"varchar(20) to varchar(10)", col(oidVarchar, 24), col(oidVarchar, 14), false, false},
		{"varchar(10) to varchar", col(oidVarchar, 14), col(oidVarchar, -1), false, true},
		{"varchar to varchar(10)", col(oidVarchar, -1), col(oidVarchar, 14), false, false},
		{"varchar(10) to text", col(oidVarchar, 14), col(oidText, -1), true, true},
		{"text to varchar", col(oidText, -1), col(oidVarchar, -1), false, false},
		{"numeric(8,2) to (14,4)", col(oidNumeric, numeric(8, 2)), col(oidNumeric, numeric(14, 4)), false, true},
		{"numeric(8,2) to (14,4), a key", col(oidNumeric, numeric(8, 2)), col(oidNumeric, numeric(14, 4)), true, false},
		{"numeric(8,2) to (12,2), a key", col(oidNumeric, numeric(8, 2)), col(oidNumeric, numeric(12, 2)), true, true},
		{"numeric(8,2) to (9,4): fewer integer digits", col(oidNumeric, numeric(8, 2)), col(oidNumeric, numeric(9, 4)), false, false},
		{"numeric(8,2) to (8,1)", col(oidNumeric, numeric(8, 2)), col(oidNumeric, numeric(8, 1)), false, false},
		{"numeric(8,2) to numeric", col(oidNumeric, numeric(8, 2)), col(oidNumeric, -1), true, true},
		{"numeric to numeric(8,2)", col(oidNumeric, -1), col(oidNumeric, numeric(8, 2)), false, false},
		{"timestamp(0) to timestamp(3)", col(oidTimestamp, 0), col(oidTimestamp, 3), true, true},
		{"timestamp(3) to timestamp", col(oidTimestamp, 3), col(oidTimestamp, -1), false, true},
		{"timestamp to timestamp(3)", col(oidTimestamp, -1), col(oidTimestamp, 3), false, false},
		{"timestamp to timestamptz", col(oidTimestamp, -1), col(oidTimestampTZ, -1), false, false},
		{"timestamptz(0) to (6)", col(oidTimestampTZ, 0), col(oidTimestampTZ, 6), false, true},
		{"unchanged", col(oidText, -1), col(oidText, -1), true, true},
	} {
		if got := Widens(c.from, c.to, c.key); got != c.want {
			t.Errorf("%s: Widens = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestWidenings: a definition that differs only by widened types gives the
// target columns to widen; any other difference, or a type that does not
// widen, gives none.
func TestWidenings(t *testing.T) {
	t.Parallel()
	base := func() *JoinPlan {
		p := &JoinPlan{Type: "left",
			Left: TablePlan{Key: []SourceColumn{{Name: "id", Type: "integer", TypeOID: oidInt4, TypeMod: -1}},
				ForeignKey: []SourceColumn{{Name: "customer_id", Type: "integer", TypeOID: oidInt4, TypeMod: -1}},
				Values:     []OutputColumn{{Name: "code", Source: SourceColumn{Name: "code", Type: "character varying(5)", TypeOID: oidVarchar, TypeMod: 9}}},
				KeyNames:   []string{"id"}},
			Right: TablePlan{Key: []SourceColumn{{Name: "id", Type: "integer", TypeOID: oidInt4, TypeMod: -1}}},
		}
		p.Target = sink.Table{Schema: "public", Name: "t", KeyCount: 1,
			Columns: []sink.Column{{Name: "id", Type: "integer"}, {Name: "code", Type: "character varying(5)"}}}
		return p
	}
	old := Definition(base())

	wide := base()
	wide.Left.Key[0].Type, wide.Left.Key[0].TypeOID = "bigint", oidInt8
	wide.Left.ForeignKey[0].Type, wide.Left.ForeignKey[0].TypeOID = "bigint", oidInt8
	wide.Right.Key[0].Type, wide.Right.Key[0].TypeOID = "bigint", oidInt8
	wide.Left.Values[0].Source.Type, wide.Left.Values[0].Source.TypeOID, wide.Left.Values[0].Source.TypeMod = "text", oidText, -1
	wide.Target.Columns[0].Type, wide.Target.Columns[1].Type = "bigint", "text"
	ws, ok, err := Widenings(old, Definition(wide))
	if err != nil || !ok || len(ws) != 2 || ws[0] != (Widening{"id", "integer", "bigint"}) || ws[1] != (Widening{"code", "character varying(5)", "text"}) {
		t.Fatalf("Widenings = %v, %v, %v", ws, ok, err)
	}

	fkOnly := base() // a column outside the target
	fkOnly.Left.ForeignKey[0].Type, fkOnly.Left.ForeignKey[0].TypeOID = "bigint", oidInt8
	if ws, ok, err := Widenings(old, Definition(fkOnly)); err != nil || !ok || len(ws) != 0 {
		t.Fatalf("foreign key only: %v, %v, %v", ws, ok, err)
	}

	narrow := base()
	narrow.Left.Values[0].Source.TypeMod = 8
	narrow.Target.Columns[1].Type = "character varying(4)"
	renamed := base()
	renamed.Target.Columns[1].Name = "code2"
	added := base()
	added.Left.Values = append(added.Left.Values, OutputColumn{Name: "x", Source: SourceColumn{Name: "x", TypeOID: oidText, TypeMod: -1}})
	for name, p := range map[string]*JoinPlan{"narrowed": narrow, "renamed": renamed, "column added": added} {
		if _, ok, err := Widenings(old, Definition(p)); err != nil || ok {
			t.Errorf("%s: Widenings ok = %v, %v; want not a widening", name, ok, err)
		}
	}
}
