// Package plantest holds resolved join plans for tests.
package plantest

import (
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/plan"
)

// Wide is the list-form example (testdata/nway.yaml of internal/config) resolved: orders with their
// customer (left), product (inner) and the customer's region (left).
func Wide() *plan.JoinPlan {
	col := func(name, typ string) plan.SourceColumn { return plan.SourceColumn{Name: name, Type: typ} }
	out := func(c plan.SourceColumn, as string) plan.OutputColumn { return plan.OutputColumn{Source: c, Name: as} }
	id, bigint := col("id", "bigint"), col("id", "bigint")
	p := &plan.JoinPlan{Name: "orders_wide", Type: config.JoinLeft}
	p.Left = plan.TablePlan{Table: config.TableName{Schema: "public", Name: "orders"}, Key: []plan.SourceColumn{id}, KeyNames: []string{"id"},
		Values: []plan.OutputColumn{out(col("customer_id", "bigint"), "customer_id"), out(col("product_id", "bigint"), "product_id"),
			out(col("amount", "numeric"), "amount")}}
	p.Edges = []plan.EdgePlan{
		{Alias: "customers", Parent: -1, Type: config.JoinLeft, Table: plan.TablePlan{Table: config.TableName{Schema: "public", Name: "customers"},
			Key: []plan.SourceColumn{bigint}, ForeignKey: []plan.SourceColumn{col("customer_id", "bigint")},
			Values: []plan.OutputColumn{out(col("name", "text"), "customer_name")}}},
		{Alias: "products", Parent: -1, Type: config.JoinInner, Table: plan.TablePlan{Table: config.TableName{Schema: "public", Name: "products"},
			Key: []plan.SourceColumn{bigint}, ForeignKey: []plan.SourceColumn{col("product_id", "bigint")},
			Values: []plan.OutputColumn{out(col("title", "text"), "product_title")}}},
		{Alias: "regions", Parent: 0, Type: config.JoinLeft, Table: plan.TablePlan{Table: config.TableName{Schema: "public", Name: "regions"},
			Key: []plan.SourceColumn{col("id", "integer")}, ForeignKey: []plan.SourceColumn{col("region_id", "integer")},
			Values: []plan.OutputColumn{out(col("name", "text"), "region_name")}}},
	}
	return p
}
