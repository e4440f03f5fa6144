package pipeline

import (
	"errors"
	"strings"
	"testing"

	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/plan/plantest"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/join/jointest"
)

const (
	oidInt8 = 20
	oidText = 25
)

func testPlan() *plan.JoinPlan {
	col := func(n string, oid uint32) plan.SourceColumn { return plan.SourceColumn{Name: n, TypeOID: oid} }
	return &plan.JoinPlan{
		Name: "oe",
		Left: plan.TablePlan{
			Table:      config.TableName{Schema: "public", Name: "orders"},
			Key:        []plan.SourceColumn{col("id", oidInt8)},
			ForeignKey: []plan.SourceColumn{col("customer_id", oidInt8)},
			Values:     []plan.OutputColumn{{Source: col("customer_id", oidInt8)}, {Source: col("note", oidText)}},
		},
		Right: plan.TablePlan{
			Table:  config.TableName{Schema: "public", Name: "customers"},
			Key:    []plan.SourceColumn{col("id", oidInt8)},
			Values: []plan.OutputColumn{{Source: col("name", oidText)}},
		},
	}
}

// testTreePlan is orders LEFT JOIN customers LEFT JOIN regions (through
// the customers' region_id): a tree of three tables.
func testTreePlan() *plan.JoinPlan {
	col := func(n string, oid uint32, typ string) plan.SourceColumn {
		return plan.SourceColumn{Name: n, TypeOID: oid, Type: typ}
	}
	id, name := col("id", oidInt8, "bigint"), col("name", oidText, "text")
	return &plan.JoinPlan{
		Name: "ocr", Type: config.JoinLeft,
		Left: plan.TablePlan{
			Table:  config.TableName{Schema: "public", Name: "orders"},
			Key:    []plan.SourceColumn{id},
			Values: []plan.OutputColumn{{Source: col("customer_id", oidInt8, "bigint")}, {Source: col("note", oidText, "text")}},
		},
		Edges: []plan.EdgePlan{
			{Alias: "customers", Parent: -1, Type: config.JoinLeft, Table: plan.TablePlan{
				Table: config.TableName{Schema: "public", Name: "customers"}, Key: []plan.SourceColumn{id},
				ForeignKey: []plan.SourceColumn{col("customer_id", oidInt8, "bigint")},
				Values:     []plan.OutputColumn{{Source: name, Name: "customer_name"}}}},
			{Alias: "regions", Parent: 0, Type: config.JoinLeft, Table: plan.TablePlan{
				Table: config.TableName{Schema: "public", Name: "regions"}, Key: []plan.SourceColumn{id},
				ForeignKey: []plan.SourceColumn{col("region_id", oidInt8, "bigint")},
				Values:     []plan.OutputColumn{{Source: name, Name: "region_name"}}}},
		},
	}
}

func rel(name string, cols ...cdc.Column) *cdc.Relation {
	return &cdc.Relation{Namespace: "public", Name: name, Columns: cols}
}

func txt(s string) cdc.Value { return cdc.Value{Kind: cdc.ValueText, Data: []byte(s)} }

var (
	cNull  = cdc.Value{Kind: cdc.ValueNull}
	cToast = cdc.Value{Kind: cdc.ValueUnchanged}
)

func TestMapperChanges(t *testing.T) {
	t.Parallel()
	// Column order differs from the plan and an extra column exists: mapping is by name.
	orders := rel("orders", cdc.Column{Name: "note", Type: oidText}, cdc.Column{Name: "id", Type: oidInt8, Key: true},
		cdc.Column{Name: "extra", Type: oidText}, cdc.Column{Name: "customer_id", Type: oidInt8})
	customers := rel("customers", cdc.Column{Name: "id", Type: oidInt8, Key: true}, cdc.Column{Name: "name", Type: oidText})
	other := rel("unrelated", cdc.Column{Name: "id", Type: oidInt8})
	m := newMapper(testPlan())

	changes := []cdc.Change{
		{Kind: cdc.ChangeInsert, Relation: orders, New: []cdc.Value{txt("n"), txt("1"), txt("x"), txt("7")}},
		{Kind: cdc.ChangeUpdate, Relation: orders, New: []cdc.Value{cToast, txt("1"), txt("x"), cNull}},
		// key change with an unchanged TOASTed note: one key change, so
		// that the engine fills the note from the old key's row
		{Kind: cdc.ChangeUpdate, Relation: orders, OldKind: cdc.OldKey, Old: []cdc.Value{cNull, txt("1"), cNull, cNull},
			New: []cdc.Value{cToast, txt("2"), txt("x"), txt("7")}},
		{Kind: cdc.ChangeDelete, Relation: customers, OldKind: cdc.OldKey, Old: []cdc.Value{txt("7"), cNull}},
		{Kind: cdc.ChangeInsert, Relation: other, New: []cdc.Value{txt("1")}},
		{Kind: cdc.ChangeTruncate, Truncate: &cdc.Truncate{Relations: []*cdc.Relation{orders, other, customers}}},
	}
	var got []join.Change
	for i := range changes {
		var err error
		if got, err = m.appendChanges(got, &changes[i]); err != nil {
			t.Fatalf("change %d: %v", i, err)
		}
	}
	kinds := []join.ChangeKind{join.LeftUpsert, join.LeftUpsert, join.LeftKeyChange, join.RightDelete,
		join.LeftTruncate, join.RightTruncate}
	if len(got) != len(kinds) {
		t.Fatalf("got %d changes, want %d: %+v", len(got), len(kinds), got)
	}
	for i, k := range kinds {
		if got[i].Kind != k {
			t.Errorf("change %d kind = %s, want %s", i, got[i].Kind, k)
		}
	}
	first := got[0].Left
	if first.PK[0].Text != "1" || first.FK[0].Text != "7" || first.Values[1].Text != "n" {
		t.Errorf("insert mapped to %+v", first)
	}
	// Only the INSERT is marked as one: the engine skips reading its state.
	if !got[0].Insert || got[1].Insert || got[2].Insert {
		t.Errorf("Insert marks = %t, %t, %t; want true, false, false", got[0].Insert, got[1].Insert, got[2].Insert)
	}
	if !got[1].Left.Values[1].Toast || !got[1].Left.FK[0].Null {
		t.Errorf("toast/null update mapped to %+v", got[1].Left)
	}
	if kc := got[2]; kc.OldKey[0].Text != "1" || kc.Left.PK[0].Text != "2" || !kc.Left.Values[1].Toast {
		t.Errorf("key change mapped to %+v", kc)
	}
}

// TestMapperSelfJoin: a change of a table that is both sides of the join is
// a left and a right change, a key change on both sides, a truncate both.
func TestMapperSelfJoin(t *testing.T) {
	t.Parallel()
	col := func(n string, oid uint32) plan.SourceColumn { return plan.SourceColumn{Name: n, TypeOID: oid} }
	emp := config.TableName{Schema: "public", Name: "employees"}
	jp := &plan.JoinPlan{Name: "em",
		Left: plan.TablePlan{Table: emp, Key: []plan.SourceColumn{col("id", oidInt8)}, ForeignKey: []plan.SourceColumn{col("manager_id", oidInt8)},
			Values: []plan.OutputColumn{{Source: col("name", oidText)}, {Source: col("manager_id", oidInt8)}}},
		Right: plan.TablePlan{Table: emp, Key: []plan.SourceColumn{col("id", oidInt8)}, Values: []plan.OutputColumn{{Source: col("name", oidText)}}},
	}
	r := rel("employees", cdc.Column{Name: "id", Type: oidInt8, Key: true}, cdc.Column{Name: "name", Type: oidText},
		cdc.Column{Name: "manager_id", Type: oidInt8})
	changes := []cdc.Change{
		{Kind: cdc.ChangeInsert, Relation: r, New: []cdc.Value{txt("2"), txt("ann"), txt("2")}},
		{Kind: cdc.ChangeUpdate, Relation: r, OldKind: cdc.OldKey, Old: []cdc.Value{txt("2"), cNull, cNull},
			New: []cdc.Value{txt("3"), cToast, txt("2")}},
		{Kind: cdc.ChangeDelete, Relation: r, OldKind: cdc.OldKey, Old: []cdc.Value{txt("3"), cNull, cNull}},
		{Kind: cdc.ChangeTruncate, Truncate: &cdc.Truncate{Relations: []*cdc.Relation{r}}},
	}
	m := newMapper(jp)
	var got []join.Change
	for i := range changes {
		var err error
		if got, err = m.appendChanges(got, &changes[i]); err != nil {
			t.Fatalf("change %d: %v", i, err)
		}
	}
	want := []join.ChangeKind{join.LeftUpsert, join.RightUpsert, join.LeftKeyChange, join.RightKeyChange,
		join.LeftDelete, join.RightDelete, join.LeftTruncate, join.RightTruncate}
	if len(got) != len(want) {
		t.Fatalf("got %d changes, want %d: %+v", len(got), len(want), got)
	}
	for i, k := range want {
		if got[i].Kind != k {
			t.Errorf("change %d kind = %s, want %s", i, got[i].Kind, k)
		}
	}
	if !got[0].Insert || !got[1].Insert {
		t.Errorf("an INSERT of a self-referencing table is an insert on both sides: %t, %t", got[0].Insert, got[1].Insert)
	}
	if l := got[0].Left; l.PK[0].Text != "2" || l.FK[0].Text != "2" || l.Values[0].Text != "ann" {
		t.Errorf("left upsert = %+v", l)
	}
	if r := got[3]; r.OldKey[0].Text != "2" || r.Right.Key[0].Text != "3" || !r.Right.Values[0].Toast {
		t.Errorf("right key change = %+v", r)
	}
}

func TestMapperSchemaChange(t *testing.T) {
	t.Parallel()
	m := newMapper(testPlan())
	dropped := rel("orders", cdc.Column{Name: "id", Type: oidInt8, Key: true}, cdc.Column{Name: "note", Type: oidText})
	retyped := rel("orders", cdc.Column{Name: "id", Type: oidInt8, Key: true}, cdc.Column{Name: "note", Type: oidText},
		cdc.Column{Name: "customer_id", Type: oidText})
	added := rel("orders", cdc.Column{Name: "id", Type: oidInt8, Key: true}, cdc.Column{Name: "note", Type: oidText},
		cdc.Column{Name: "customer_id", Type: oidInt8}, cdc.Column{Name: "new_col", Type: oidText})
	for name, r := range map[string]*cdc.Relation{"dropped": dropped, "retyped": retyped} {
		_, err := m.appendChanges(nil, &cdc.Change{Kind: cdc.ChangeSchema, Schema: &cdc.SchemaChange{Old: r, New: r}})
		if !errors.Is(err, ErrSchemaChanged) {
			t.Errorf("%s: err = %v, want ErrSchemaChanged", name, err)
		}
	}
	if _, err := m.appendChanges(nil, &cdc.Change{Kind: cdc.ChangeSchema, Schema: &cdc.SchemaChange{Old: added, New: added}}); err != nil {
		t.Errorf("added column: %v", err)
	}
}

// TestMapperSchemaChangeFix: the fix named in the error works for the
// column at hand: a retyped target column needs the target dropped, a
// retyped column that only the join state holds needs a forced backfill.
func TestMapperSchemaChangeFix(t *testing.T) {
	t.Parallel()
	customersRetyped := rel("customers", cdc.Column{Name: "id", Type: oidText, Key: true}, cdc.Column{Name: "name", Type: oidText})
	ordersRetyped := rel("orders", cdc.Column{Name: "id", Type: oidInt8, Key: true}, cdc.Column{Name: "note", Type: oidText},
		cdc.Column{Name: "customer_id", Type: oidText})
	ordersDropped := rel("orders", cdc.Column{Name: "id", Type: oidInt8, Key: true}, cdc.Column{Name: "note", Type: oidText})
	for _, tc := range []struct {
		name      string
		rel       *cdc.Relation
		want, not []string
	}{
		{"right key retyped", customersRetyped, []string{`"id"`, "public.customers", "changed type", "start fkmat run again", "beside"}, []string{"teardown"}},
		{"target column retyped", ordersRetyped, []string{`"customer_id"`, "changed type", "start fkmat run again", "keeps its rows"}, nil},
		{"dropped", ordersDropped, []string{`"customer_id"`, "dropped", "configuration", "start fkmat run again"}, nil},
	} {
		_, err := newMapper(testPlan()).appendChanges(nil, &cdc.Change{Kind: cdc.ChangeSchema, Schema: &cdc.SchemaChange{Old: tc.rel, New: tc.rel}})
		if !errors.Is(err, ErrSchemaChanged) {
			t.Fatalf("%s: err = %v, want ErrSchemaChanged", tc.name, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not mention %s", tc.name, err, w)
			}
		}
		for _, w := range tc.not {
			if strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q mentions %s", tc.name, err, w)
			}
		}
	}
}

// TestChainMapper maps source changes of the n-way example, with customers
// joined a second time as seller, to the chain's table changes: the left
// table's rows carry their projected columns, a customer carries its name
// and its hidden region_id, a customers change reaches both entries, and a
// TRUNCATE reaches the entries of its table.
func TestChainMapper(t *testing.T) {
	p := plantest.Wide()
	seller := p.Edges[0]
	seller.Alias, seller.Table.ForeignKey = "seller", []plan.SourceColumn{{Name: "seller_id", Type: "bigint", TypeOID: oidInt8}}
	seller.Table.Values = []plan.OutputColumn{{Source: plan.SourceColumn{Name: "name", Type: "text"}, Name: "seller_name"}}
	p.Edges = append(p.Edges, seller)
	p.Left.Values = append(p.Left.Values, plan.OutputColumn{Source: plan.SourceColumn{Name: "seller_id", Type: "bigint"}, Name: "seller_id"})
	for _, tp := range []*plan.TablePlan{&p.Left, &p.Edges[0].Table, &p.Edges[1].Table, &p.Edges[2].Table, &p.Edges[3].Table} {
		for i := range tp.Key {
			tp.Key[i].TypeOID = oidInt8
		}
		for i := range tp.Values {
			tp.Values[i].Source.TypeOID = oidText
		}
		for i := range tp.ForeignKey {
			tp.ForeignKey[i].TypeOID = oidText
		}
	}
	m := newTableMapper(p, plan.CarriedOf(p))
	orders := rel("orders", cdc.Column{Name: "id", Type: oidInt8}, cdc.Column{Name: "amount", Type: oidText},
		cdc.Column{Name: "customer_id", Type: oidText}, cdc.Column{Name: "product_id", Type: oidText}, cdc.Column{Name: "seller_id", Type: oidText})
	customers := rel("customers", cdc.Column{Name: "region_id", Type: oidText}, cdc.Column{Name: "id", Type: oidInt8},
		cdc.Column{Name: "name", Type: oidText})
	regions := rel("regions", cdc.Column{Name: "id", Type: oidInt8}, cdc.Column{Name: "name", Type: oidText})
	var got []join.Change
	for _, c := range []cdc.Change{
		{Kind: cdc.ChangeInsert, Relation: orders, New: []cdc.Value{txt("100"), txt("5"), txt("1"), txt("10"), txt("2")}},
		{Kind: cdc.ChangeUpdate, Relation: customers, OldKind: cdc.OldKey, Old: []cdc.Value{cNull, txt("1"), cNull},
			New: []cdc.Value{txt("7"), txt("3"), cToast}},
		{Kind: cdc.ChangeTruncate, Truncate: &cdc.Truncate{Relations: []*cdc.Relation{regions}}},
	} {
		var err error
		if got, err = m.appendChanges(got, &c); err != nil {
			t.Fatal(err)
		}
	}
	v := jointest.Values
	want := []join.Change{
		{Table: 0, Kind: join.LeftUpsert, Insert: true, Left: join.LeftRow{PK: v("100"), FK: []join.Value{}, Values: v("1", "10", "5", "2")}},
		{Table: 1, Kind: join.RightKeyChange, OldKey: v("1"), Right: join.RightRow{Key: v("3"), Values: v("TOAST", "7")}},
		{Table: 4, Kind: join.RightKeyChange, OldKey: v("1"), Right: join.RightRow{Key: v("3"), Values: v("TOAST")}},
		{Table: 3, Kind: join.RightTruncate},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d changes, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Table != w.Table || g.Kind != w.Kind || g.Insert != w.Insert ||
			!join.ValuesEqual(g.OldKey, w.OldKey) || !join.ValuesEqual(g.Left.PK, w.Left.PK) ||
			!join.ValuesEqual(g.Left.Values, w.Left.Values) || !join.ValuesEqual(g.Right.Key, w.Right.Key) ||
			!join.ValuesEqual(g.Right.Values, w.Right.Values) {
			t.Errorf("change %d = %+v, want %+v", i, g, w)
		}
	}
}
