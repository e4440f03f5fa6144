package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// The file is read node by node rather than decoded into the structs, so
// that every unknown key and every value of the wrong shape is reported at
// once, each with its line and in the words of the file: a Go type name in
// a message names nothing the user can change.

// emptyFile is the problem of a file that holds no configuration.
const emptyFile = "the file is empty: it needs at least `joins:`, and the connections unless flags or the environment give them, e.g.\n" +
	"    source: postgres://app@localhost:5432/shop\n" +
	"    redis: redis://localhost:6379/0\n" +
	"    joins:\n" +
	"      - name: orders_enriched\n" +
	"        type: left\n" +
	"        left: {table: public.orders, foreign_key: [customer_id]}\n" +
	"        right: {table: public.customers}\n" +
	"        target: {table: public.orders_enriched}"

// parse reads a configuration file. A file that is not YAML, or is empty,
// gives a nil Config and its one problem; otherwise the Config holds what
// could be read, and problems every key or value that could not.
func parse(data []byte) (*Config, []string) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, []string{emptyFile}
		}
		return nil, []string{syntaxProblem(data, err)}
	}
	root := resolve(doc.Content[0])
	if isNull(root) {
		return nil, []string{emptyFile}
	}
	d := &decoder{join: -1, unread: map[string]bool{}}
	var cfg Config
	if !d.config(root, &cfg) {
		return nil, d.problems
	}
	cfg.unread = d.unread
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case errors.Is(err, io.EOF):
	case err != nil:
		d.problems = append(d.problems, syntaxProblem(data, err))
	case len(next.Content) > 0 && !isNull(next.Content[0]):
		d.addf(next.Content[0], "a second YAML document (after ---): keep one configuration per file")
	}
	return &cfg, d.problems
}

var errorLine = regexp.MustCompile(`line (\d+):`)

// syntaxProblem explains a YAML syntax error; indentation by tabs, which
// YAML forbids and editors hide, gets its own message.
func syntaxProblem(data []byte, err error) string {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if m := errorLine.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
	}
	if tab := tabIndented(data); tab > 0 && (strings.Contains(msg, "tab") || tab == line) {
		return fmt.Sprintf("line %d: indented with a tab: YAML does not allow tabs in indentation; indent with spaces", tab)
	}
	return "malformed YAML: " + msg + " (check the indentation, and that every [, { and quote is closed)"
}

// tabIndented returns the first line whose indentation holds a tab, or 0.
func tabIndented(data []byte) int {
	for i, line := range strings.Split(string(data), "\n") {
		indent := line[:len(line)-len(strings.TrimLeft(line, " \t"))]
		if strings.Contains(indent, "\t") && strings.TrimSpace(line) != "" {
			return i + 1
		}
	}
	return 0
}

// decoder reads the nodes of a configuration and collects its problems.
type decoder struct {
	problems []string
	// unread holds the keys whose values could not be read (Config.unread);
	// join is the index of the join being read (-1: none), prefix
	// "right[2]." while an entry of right is.
	unread map[string]bool
	join   int
	prefix string
}

// fail records that the value of key (left.foreign_key) could not be read,
// or that it was misspelled.
func (d *decoder) fail(key string) {
	d.unread[fmt.Sprintf("%d/%s%s", d.join, d.prefix, key)] = true
}

func (d *decoder) addf(n *yaml.Node, format string, args ...any) {
	d.problems = append(d.problems, fmt.Sprintf("line %d: ", n.Line)+fmt.Sprintf(format, args...))
}

// A field is a key of a mapping and what reads its value.
type field struct {
	key  string
	read func(v *yaml.Node)
}

// A mapping is what one mapping of the file takes.
type mapping struct {
	what    string // in messages: "a join", "left"
	path    string // of its keys, for decoder.fail: "left."
	example string // shown when the value is not a mapping; %s stands for a table

	fields []field
	// misplaced explains a key that belongs in another mapping, or
	// returns "".
	misplaced func(key string) string
}

func (m mapping) keys() []string {
	keys := make([]string, len(m.fields))
	for i, f := range m.fields {
		keys[i] = f.key
	}
	return keys
}

// readMapping reads n by the fields of m, and reports every unknown or
// repeated key. It reports false when n is not a mapping.
func (d *decoder) readMapping(n *yaml.Node, m mapping) bool {
	if n.Kind != yaml.MappingNode {
		table := "public.orders"
		if n.Kind == yaml.ScalarNode && !isNull(n) {
			table = n.Value
		}
		example := ""
		if m.example != "" {
			example = ", e.g. " + strings.ReplaceAll(m.example, "%s", table)
		}
		d.addf(n, "%s must be a mapping of %s%s", m.what, strings.Join(m.keys(), ", "), example)
		d.fail(strings.TrimSuffix(m.path, "."))
		return false
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], resolve(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			d.addf(k, "a key of %s must be a plain name; use %s", m.what, strings.Join(m.keys(), ", "))
			continue
		}
		if line, dup := seen[k.Value]; dup {
			d.addf(k, "%s is given twice in %s (also on line %d); keep one", k.Value, m.what, line)
			continue
		}
		seen[k.Value] = k.Line
		if i := slices.IndexFunc(m.fields, func(f field) bool { return f.key == k.Value }); i >= 0 {
			m.fields[i].read(v)
			continue
		}
		d.unknownKey(k, m)
	}
	return true
}

// unknownKey reports a key that mapping m does not take, with the key the
// user probably meant and the keys m takes.
func (d *decoder) unknownKey(k *yaml.Node, m mapping) {
	if m.misplaced != nil {
		if msg := m.misplaced(k.Value); msg != "" {
			d.addf(k, "%s", msg)
			return
		}
	}
	msg := fmt.Sprintf("%s has no key %q", m.what, k.Value)
	if s := closest(k.Value, m.keys()); s != "" {
		msg += "; did you mean " + s + "?"
		d.fail(m.path + s)
	}
	msg += " (allowed: " + strings.Join(m.keys(), ", ") + ")"
	if hint := unsupportedKeys[strings.ToLower(k.Value)]; hint != "" {
		msg += "; " + hint
	}
	d.addf(k, "%s", msg)
}

// unsupportedKeys names, for keys users write for what fkmat does not do,
// why and what to do instead.
var unsupportedKeys = map[string]string{
	"on":        nonEquality,
	"condition": nonEquality,
	"join_on":   nonEquality,
	"where":     filterPlace,
	"filter":    filterPlace,
	"group_by":  noAggregates,
	"aggregate": noAggregates,
	"having":    noAggregates,
	"<<":        "YAML merge keys (<<) are not supported: write the keys out",
}

const (
	filterPlace = "a filter belongs to the table it filters: write where: under left or under an entry of right, " +
		"e.g. left: {table: public.orders, where: \"status <> 'draft'\"}"
	nonEquality = "joins are on a foreign key equal to the referenced key only: conditions other than that equality " +
		"(non-equality joins) are not supported; write foreign_key, and filter each table with its where:"
	noAggregates = "aggregates are not supported: fkmat maintains the rows of a join; aggregate in a view over the target"
)

// Closest returns the name of allowed that name is likely a misspelling
// of, or "".
func Closest(name string, allowed []string) string { return closest(name, allowed) }

// closest returns the allowed key that key is likely a misspelling of, or
// "".
func closest(key string, allowed []string) string {
	squash := strings.NewReplacer("_", "", "-", "", " ", "")
	norm := func(s string) string { return squash.Replace(strings.ToLower(s)) }
	best, bestDist := "", 3
	for _, a := range allowed {
		if norm(a) == norm(key) {
			return a
		}
		limit := 1
		if len(a) > 4 {
			limit = 2
		}
		if dist := editDistance(strings.ToLower(key), a); dist <= limit && dist < bestDist {
			best, bestDist = a, dist
		}
	}
	return best
}

// editDistance is the number of single-character insertions, deletions,
// substitutions and transpositions that turn a into b.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// resolve follows YAML aliases (*name) to the node they name.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	return n
}

// isNull reports an empty value (`key:`, `~`, `null`).
func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// Keys of a join and of its parts, for the messages about keys written in
// the wrong mapping.
var (
	joinKeys  = []string{"name", "type", "left", "right", "rollups", "target"}
	sideKeys  = []string{"table", "key", "foreign_key", "columns", "where"}
	entryOnly = []string{"from", "as"}
	topKeys   = []string{"source", "redis", "slot", "publication", "timezone"}
)

func (d *decoder) config(n *yaml.Node, c *Config) bool {
	return d.readMapping(n, mapping{
		what: "the top level",
		fields: []field{
			{"source", d.text(&c.Source, "source", "postgres://app@localhost:5432/shop")},
			{"target", d.text(&c.Target, "target", "postgres://app@localhost:5432/shop (the target database; a join's target table goes in the join)")},
			{"redis", d.text(&c.Redis, "redis", "redis://localhost:6379/0")},
			{"slot", d.text(&c.Slot, "slot", "fkmat_shop")},
			{"publication", d.text(&c.Publication, "publication", "fkmat_shop")},
			{"timezone", d.text(&c.TimeZone, "timezone", "Europe/Paris")},
			{"joins", d.joins(&c.Joins)},
		},
		misplaced: func(key string) string {
			switch {
			case slices.Contains(joinKeys, key):
				return key + " belongs to a join: write it in an entry under `joins:` (- name: ...)"
			case slices.Contains(sideKeys, key):
				return key + " belongs to a join's left or right: write it under `joins:`, e.g. left: {table: public.orders, foreign_key: [customer_id]}"
			}
			return ""
		},
	})
}

func (d *decoder) joins(dst *[]JoinConfig) func(*yaml.Node) {
	return func(v *yaml.Node) {
		switch {
		case isNull(v):
		case v.Kind == yaml.SequenceNode:
			for _, e := range v.Content {
				var j JoinConfig
				if d.join = len(*dst); d.readJoin(resolve(e), &j) {
					*dst = append(*dst, j)
				}
			}
			d.join = -1
		default:
			d.fail("joins")
			d.addf(v, "joins must be a list: start each join with \"- \", as in\n    joins:\n      - name: orders_enriched\n        type: left\n        ...")
		}
	}
}

// readJoin reads one join: `right:` as a mapping (two tables) or a list
// (more).
func (d *decoder) readJoin(n *yaml.Node, j *JoinConfig) bool {
	return d.readMapping(n, mapping{
		what:    "a join",
		example: "{name: orders_enriched, type: left, left: {table: public.orders, foreign_key: [customer_id]}, right: {table: public.customers}, target: {table: public.orders_enriched}}",
		fields: []field{
			{"name", d.text(&j.Name, "name", "orders_enriched")},
			{"type", d.text(&j.Type, "type", "left")},
			{"left", d.sub(func(v *yaml.Node) { d.readMapping(v, leftMapping(d, &j.Left)) })},
			{"right", d.sub(func(v *yaml.Node) { d.right(v, j) })},
			{"rollups", d.sub(func(v *yaml.Node) { d.rollups(v, j) })},
			{"target", d.sub(func(v *yaml.Node) {
				d.readMapping(v, mapping{what: "target", path: "target.", example: "{table: %s}", fields: []field{
					{"table", d.table(&j.Target.Table, "target.table")},
				}})
			})},
		},
		misplaced: func(key string) string {
			switch {
			case slices.Contains(sideKeys, key):
				return key + " belongs under left or right, e.g. left: {table: public.orders, foreign_key: [customer_id]}"
			case slices.Contains(entryOnly, key):
				return key + " belongs to an entry of right (the list form, for joins of more than two tables)"
			case slices.Contains(topKeys, key):
				return key + " belongs at the top level of the file, not in a join"
			}
			return ""
		},
	})
}

func leftMapping(d *decoder, l *LeftConfig) mapping {
	return mapping{what: "left", path: "left.", example: "{table: %s, foreign_key: [customer_id]}", fields: []field{
		{"table", d.table(&l.Table, "left.table")},
		{"key", d.names(&l.Key, "left.key", "id")},
		{"foreign_key", d.names(&l.ForeignKey, "left.foreign_key", "customer_id")},
		{"columns", d.columns(&l.Columns, "left.columns")},
		{"where", d.text(&l.Where, "left.where", `"status <> 'draft'"`)},
	}}
}

func (d *decoder) right(v *yaml.Node, j *JoinConfig) {
	switch v.Kind {
	case yaml.MappingNode:
		r := &j.Right
		d.readMapping(v, mapping{what: "right", path: "right.", fields: []field{
			{"table", d.table(&r.Table, "right.table")},
			{"key", d.names(&r.Key, "right.key", "id")},
			{"columns", d.columns(&r.Columns, "right.columns")},
			{"where", d.text(&r.Where, "right.where", `"deleted_at IS NULL"`)},
		}, misplaced: func(key string) string {
			switch {
			case key == "foreign_key":
				return "right.foreign_key: in a join of two tables the foreign key is the left table's; move it to left.foreign_key " +
					"(or write right as a list of entries, for joins of more than two tables)"
			case slices.Contains(entryOnly, key) || key == "type":
				return fmt.Sprintf("right.%s belongs to the list form of right (joins of more than two tables): "+
					"write right as a list of entries, or leave %s out", key, key)
			}
			return ""
		}})
	case yaml.SequenceNode:
		j.Rights = []RightConfig{}
		for _, e := range v.Content {
			var r RightConfig
			if d.prefix = fmt.Sprintf("right[%d].", len(j.Rights)); d.readMapping(resolve(e), entryMapping(d, &r)) {
				j.Rights = append(j.Rights, r)
			}
		}
		d.prefix = ""
	default:
		d.fail("right")
		d.addf(v, "right must be a mapping (two tables, e.g. {table: public.customers}) or a list of entries (more tables, e.g. [{table: public.customers, foreign_key: [customer_id]}])")
	}
}

func entryMapping(d *decoder, r *RightConfig) mapping {
	return mapping{what: "an entry of right", example: "{table: %s, foreign_key: [customer_id]}", fields: []field{
		{"table", d.table(&r.Table, "table")},
		{"key", d.names(&r.Key, "key", "id")},
		{"columns", d.columns(&r.Columns, "columns")},
		{"where", d.text(&r.Where, "where", `"deleted_at IS NULL"`)},
		{"from", d.text(&r.From, "from", "customers")},
		{"foreign_key", d.names(&r.ForeignKey, "foreign_key", "customer_id")},
		{"as", d.text(&r.As, "as", "buyer")},
		{"type", d.text(&r.Type, "type", "inner")},
	}}
}

// rollups reads the list of a join's roll-ups.
func (d *decoder) rollups(v *yaml.Node, j *JoinConfig) {
	if v.Kind != yaml.SequenceNode {
		d.fail("rollups")
		d.addf(v, "rollups must be a list of child tables, e.g. [{table: public.orders, foreign_key: [customer_id], aggregates: [\"count(*) AS orders\"]}]")
		return
	}
	j.Rollups = []RollupConfig{}
	for _, e := range v.Content {
		var r RollupConfig
		d.prefix = fmt.Sprintf("rollups[%d].", len(j.Rollups))
		ok := d.readMapping(resolve(e), mapping{what: "a roll-up", example: "{table: %s, foreign_key: [customer_id], aggregates: [\"count(*) AS orders\"]}",
			fields: []field{
				{"table", d.table(&r.Table, "table")},
				{"foreign_key", d.names(&r.ForeignKey, "foreign_key", "customer_id")},
				{"where", d.text(&r.Where, "where", `"status <> 'cancelled'"`)},
				{"aggregates", d.aggregates(&r.Aggregates, "aggregates")},
			},
			misplaced: func(key string) string {
				if key == "columns" {
					return "a roll-up has no columns: its output columns are its aggregates, e.g. aggregates: [\"count(*) AS orders\", \"sum(amount) AS revenue\"]"
				}
				return ""
			}})
		if ok {
			j.Rollups = append(j.Rollups, r)
		}
	}
	d.prefix = ""
}

// aggregates reads a roll-up's list of aggregates.
func (d *decoder) aggregates(dst *[]Aggregate, key string) func(*yaml.Node) {
	return func(v *yaml.Node) {
		items := []*yaml.Node{v} // one aggregate may be written without the brackets
		switch {
		case isNull(v):
			items = nil
		case v.Kind == yaml.SequenceNode:
			items = v.Content
		case v.Kind != yaml.ScalarNode:
			d.fail(key)
			d.addf(v, "%s must be a list of aggregates, e.g. [\"count(*) AS orders\", \"sum(amount) AS revenue\"]", key)
			return
		}
		for _, item := range items {
			if item = resolve(item); item.Kind != yaml.ScalarNode || isNull(item) {
				d.fail(key)
				d.addf(item, "each item of %s must be an aggregate, e.g. \"count(*) AS orders\"", key)
				continue
			}
			a, err := ParseAggregate(item.Value)
			if err != nil {
				d.fail(key)
				d.addf(item, "%s: %v", key, err)
				continue
			}
			*dst = append(*dst, a)
		}
	}
}

// sub reads a nested mapping; an empty value leaves it unset, for Validate
// to name what is missing.
func (d *decoder) sub(read func(*yaml.Node)) func(*yaml.Node) {
	return func(v *yaml.Node) {
		if !isNull(v) {
			read(v)
		}
	}
}

// text reads a single value into dst.
func (d *decoder) text(dst *string, key, example string) func(*yaml.Node) {
	return func(v *yaml.Node) {
		switch {
		case isNull(v):
		case v.Kind == yaml.ScalarNode:
			*dst = v.Value
		default:
			d.fail(key)
			d.addf(v, "%s must be a single value, e.g. %s", key, example)
		}
	}
}

func (d *decoder) table(dst *TableName, key string) func(*yaml.Node) {
	return func(v *yaml.Node) {
		switch {
		case isNull(v):
		case v.Kind != yaml.ScalarNode:
			d.fail(key)
			d.addf(v, "%s must be a table name like public.orders", key)
		default:
			t, err := ParseTableName(v.Value)
			if err != nil {
				d.fail(key)
				d.addf(v, "%s: %v", key, err)
				return
			}
			*dst = t
		}
	}
}

// names reads a list of column names.
func (d *decoder) names(dst *[]string, key, example string) func(*yaml.Node) {
	return func(v *yaml.Node) {
		for _, item := range d.list(v, key, example) {
			*dst = append(*dst, item.Value)
		}
	}
}

func (d *decoder) columns(dst *[]ColumnRef, key string) func(*yaml.Node) {
	return func(v *yaml.Node) {
		for _, item := range d.list(v, key, "id, name AS customer_name") {
			c, err := ParseColumnRef(item.Value)
			if err != nil {
				d.fail(key)
				d.addf(item, "%s: %v", key, err)
				continue
			}
			*dst = append(*dst, c)
		}
	}
}

// list returns the items of a list of names. One name may be written
// without the brackets (`key: id` is `key: [id]`), as the file is written by
// hand; several need them.
func (d *decoder) list(v *yaml.Node, key, example string) []*yaml.Node {
	switch {
	case isNull(v):
		return nil
	case v.Kind == yaml.ScalarNode:
		if strings.Contains(v.Value, ",") {
			parts := strings.Split(v.Value, ",")
			for i := range parts {
				parts[i] = strings.TrimSpace(parts[i])
			}
			d.fail(key)
			d.addf(v, "%s %q: write several columns as a list, e.g. [%s]", key, v.Value, strings.Join(parts, ", "))
			return nil
		}
		return []*yaml.Node{v}
	case v.Kind == yaml.SequenceNode:
		var items []*yaml.Node
		for _, item := range v.Content {
			if item = resolve(item); item.Kind != yaml.ScalarNode || isNull(item) {
				d.fail(key)
				d.addf(item, "each item of %s must be a column name, e.g. [%s]", key, example)
				continue
			}
			items = append(items, item)
		}
		return items
	default:
		d.fail(key)
		d.addf(v, "%s must be a list of column names, e.g. [%s]", key, example)
		return nil
	}
}
