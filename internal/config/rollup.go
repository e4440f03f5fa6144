package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// RollupConfig is a child table rolled up into the row of its parent, the
// join's left table: each aggregate means the correlated subquery over the
// children whose foreign key references the parent's key and that pass
// Where.
type RollupConfig struct {
	Table TableName
	// ForeignKey are the child's columns referencing the left table's key,
	// in the key's order.
	ForeignKey []string
	// Where filters the children ("" keeps every child).
	Where      string
	Aggregates []Aggregate
}

// validateRollup returns the problems of roll-up r (keys prefixed with
// prefix); reported says a key's problem was reported while reading.
func validateRollup(r RollupConfig, prefix string, reported func(string) bool) []string {
	var probs []string
	where := prefix[:len(prefix)-1]
	if !r.Table.IsZero() {
		where = fmt.Sprintf("roll-up %s", r.Table)
	}
	if r.Table.IsZero() && !reported(prefix+"table") {
		probs = append(probs, fmt.Sprintf("%s: set table (the child table, e.g. public.orders)", where))
	}
	if len(r.ForeignKey) == 0 && !reported(prefix+"foreign_key") {
		probs = append(probs, fmt.Sprintf("%s: set foreign_key (the child's columns that reference the left table's key, e.g. [customer_id])", where))
	}
	for _, d := range duplicates(r.ForeignKey) {
		probs = append(probs, fmt.Sprintf("%s: foreign_key lists %q twice", where, d))
	}
	if len(r.Aggregates) == 0 && !reported(prefix+"aggregates") {
		probs = append(probs, fmt.Sprintf("%s: set aggregates, e.g. [\"count(*) AS orders\", \"sum(amount) AS revenue\"]", where))
	}
	return probs
}

// States returns how many Redis states the join has (plan.JoinPlan.States,
// from the file alone): one for two tables; for the list form, or a join
// with roll-ups, one per table and two per roll-up.
func (j JoinConfig) States() int {
	if !j.IsList() && len(j.Rollups) == 0 {
		return 1
	}
	entries := len(j.Rights)
	if !j.IsList() && !j.Right.Table.IsZero() {
		entries = 1
	}
	return 1 + entries + 2*len(j.Rollups)
}

// The aggregate functions a roll-up maintains.
const (
	AggCount   = "count"
	AggSum     = "sum"
	AggAvg     = "avg"
	AggMin     = "min"
	AggMax     = "max"
	AggBoolAnd = "bool_and"
	AggBoolOr  = "bool_or"
	AggJSONB   = "jsonb_agg"
)

var aggregateFuncs = []string{AggCount, AggSum, AggAvg, AggMin, AggMax, AggBoolAnd, AggBoolOr, AggJSONB}

// Aggregate is one item of a roll-up's `aggregates`: `func(arg) AS alias`,
// `count(*) AS n`, or `jsonb_agg(expr ORDER BY col [DESC], … [LIMIT n]) AS
// alias`.
type Aggregate struct {
	Func string
	// Arg is the argument, a SQL expression over the child's columns; "*"
	// for count(*).
	Arg   string
	Alias string
	// OrderBy and Limit are jsonb_agg's: the children's order in the array
	// (by the child's columns), and how many of the first it holds (0: all).
	OrderBy []OrderItem
	Limit   int
}

// OrderItem is one column of jsonb_agg's ORDER BY.
type OrderItem struct {
	Column string
	Desc   bool
}

// ParseAggregate parses one `aggregates` item.
func ParseAggregate(s string) (Aggregate, error) {
	s = strings.TrimSpace(s)
	at, end := topLevelAs(s)
	if at < 0 {
		return Aggregate{}, fmt.Errorf("aggregate %q: name its output column with AS, e.g. %q", s, s+" AS total")
	}
	alias, err := oneIdentifier(s[end:])
	if err != nil {
		return Aggregate{}, fmt.Errorf("aggregate %q: alias: %w", s, err)
	}
	call := strings.TrimSpace(s[:at])
	open := strings.IndexByte(call, '(')
	if open <= 0 || !strings.HasSuffix(call, ")") || closingParen(call, open) != len(call)-1 {
		return Aggregate{}, fmt.Errorf("aggregate %q: write a call of %s, e.g. \"sum(amount) AS revenue\"", s, strings.Join(aggregateFuncs, ", "))
	}
	a := Aggregate{Func: strings.ToLower(strings.TrimSpace(call[:open])), Alias: alias}
	known := false
	for _, f := range aggregateFuncs {
		known = known || a.Func == f
	}
	if !known {
		msg := fmt.Sprintf("aggregate %q: %s is not an aggregate fkmat maintains (use %s)", s, a.Func, strings.Join(aggregateFuncs, ", "))
		if c := closest(a.Func, aggregateFuncs); c != "" {
			msg += fmt.Sprintf("; did you mean %s?", c)
		}
		return Aggregate{}, errors.New(msg)
	}
	arg := strings.TrimSpace(call[open+1 : len(call)-1])
	if first, _, _ := strings.Cut(arg, " "); strings.EqualFold(first, "distinct") {
		return Aggregate{}, fmt.Errorf("aggregate %q: DISTINCT is not supported in a roll-up", s)
	}
	if a.Func == AggJSONB {
		if arg, err = a.orderAndLimit(arg); err != nil {
			return Aggregate{}, fmt.Errorf("aggregate %q: %w", s, err)
		}
	} else if i := topLevelWord(arg, "order by"); i >= 0 {
		return Aggregate{}, fmt.Errorf("aggregate %q: ORDER BY only orders jsonb_agg", s)
	}
	switch {
	case arg == "":
		return Aggregate{}, fmt.Errorf("aggregate %q: %s needs an argument", s, a.Func)
	case arg == "*" && a.Func != AggCount:
		return Aggregate{}, fmt.Errorf("aggregate %q: only count takes *", s)
	}
	a.Arg = arg
	return a, nil
}

// orderAndLimit takes jsonb_agg's ORDER BY and LIMIT off arg and returns
// the argument.
func (a *Aggregate) orderAndLimit(arg string) (string, error) {
	i := topLevelWord(arg, "order by")
	if i < 0 {
		return "", errors.New("jsonb_agg needs an order: jsonb_agg(expr ORDER BY col [DESC], ... [LIMIT n])")
	}
	order := strings.TrimSpace(arg[i+len("order by"):])
	arg = strings.TrimSpace(arg[:i])
	if j := topLevelWord(order, "limit"); j >= 0 {
		n, err := strconv.Atoi(strings.TrimSpace(order[j+len("limit"):]))
		if err != nil || n <= 0 {
			return "", fmt.Errorf("LIMIT %q: give a positive whole number", strings.TrimSpace(order[j+len("limit"):]))
		}
		a.Limit, order = n, strings.TrimSpace(order[:j])
	}
	for _, item := range strings.Split(order, ",") {
		item = strings.TrimSpace(item)
		o := OrderItem{}
		name := item
		if i := strings.LastIndexAny(item, " \t"); i > 0 {
			switch dir := item[i+1:]; {
			case strings.EqualFold(dir, "desc"):
				o.Desc, name = true, strings.TrimSpace(item[:i])
			case strings.EqualFold(dir, "asc"):
				name = strings.TrimSpace(item[:i])
			}
		}
		col, err := oneIdentifier(name)
		if err != nil || looksLikeExpression(name) {
			return "", fmt.Errorf("ORDER BY %q: order by the child's columns, each optionally ASC or DESC", item)
		}
		o.Column = col
		a.OrderBy = append(a.OrderBy, o)
	}
	return arg, nil
}

// String renders the aggregate as written in the file.
func (a Aggregate) String() string {
	var b strings.Builder
	b.WriteString(a.Func + "(" + a.Arg)
	for i, o := range a.OrderBy {
		if i == 0 {
			b.WriteString(" ORDER BY ")
		} else {
			b.WriteString(", ")
		}
		b.WriteString(quoteIfNeeded(o.Column))
		if o.Desc {
			b.WriteString(" DESC")
		}
	}
	if a.Limit > 0 {
		fmt.Fprintf(&b, " LIMIT %d", a.Limit)
	}
	b.WriteString(") AS " + quoteIfNeeded(a.Alias))
	return b.String()
}

// closingParen returns the index of the parenthesis closing the one at
// open, outside quotes, or -1.
func closingParen(s string, open int) int {
	return scanTopLevel(s, open, func(i, depth int) bool { return s[i] == ')' && depth == 0 })
}

// topLevelWord returns where the words w (lower case, one space between
// them) start in s outside quotes and parentheses, as whole words, or -1.
func topLevelWord(s, w string) int {
	return scanTopLevel(s, 0, func(i, depth int) bool {
		return depth == 0 && (i == 0 || isSpace(s[i-1])) && matchWords(s[i:], w)
	})
}

// matchWords reports whether s starts with the words of w, case-insensitive,
// with any white space between them, followed by white space or the end.
func matchWords(s, w string) bool {
	for k, word := range strings.Fields(w) {
		if k > 0 {
			n := len(s) - len(strings.TrimLeft(s, " \t\r\n"))
			if n == 0 {
				return false
			}
			s = s[n:]
		}
		if len(s) < len(word) || !strings.EqualFold(s[:len(word)], word) {
			return false
		}
		s = s[len(word):]
	}
	return s == "" || isSpace(s[0])
}
