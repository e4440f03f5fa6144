package config

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// Join types.
const (
	JoinInner = "inner"
	JoinLeft  = "left"
)

// Config is the user's join definition: connections, slot and the joins it
// maintains. Load it with LoadConfig or ParseConfig,
// then apply flag/env overrides, then call Validate.
type Config struct {
	Source      string       `yaml:"source"`
	Target      string       `yaml:"target"`
	Redis       string       `yaml:"redis"`
	Slot        string       `yaml:"slot"`
	Publication string       `yaml:"publication"`
	Joins       []JoinConfig `yaml:"joins"`
}

// JoinConfig defines one foreign-key join: of two tables (`right:` a
// mapping, held in Right), or of more (`right:` a list, held in Rights; README,
// "Joins of more than two tables").
type JoinConfig struct {
	Name   string       `yaml:"name"`
	Type   string       `yaml:"type"`
	Left   LeftConfig   `yaml:"left"`
	Right  RightConfig  `yaml:"right"`
	Target TargetConfig `yaml:"target"`
	// Rights is the list form's entries, in order; nil in the two-table
	// form.
	Rights []RightConfig `yaml:"-"`
}

// IsList reports whether the join uses the list form of `right:`.
func (j JoinConfig) IsList() bool { return j.Rights != nil }

// Keys allowed in each mapping of a join. yaml.v3's KnownFields does not
// reach into a custom UnmarshalYAML, so JoinConfig checks them itself.
var (
	joinKeys       = []string{"name", "type", "left", "right", "target"}
	leftKeys       = []string{"table", "key", "foreign_key", "columns"}
	rightKeys      = []string{"table", "key", "columns"}
	rightEntryKeys = []string{"table", "key", "columns", "from", "foreign_key", "as", "type"}
	targetKeys     = []string{"table"}
)

// UnmarshalYAML decodes a join, `right:` as a mapping or as a list, and
// refuses unknown keys at every level.
func (j *JoinConfig) UnmarshalYAML(n *yaml.Node) error {
	if err := checkKeys(n, "a join", joinKeys); err != nil {
		return err
	}
	var aux struct {
		Name   string       `yaml:"name"`
		Type   string       `yaml:"type"`
		Left   yaml.Node    `yaml:"left"`
		Right  yaml.Node    `yaml:"right"`
		Target TargetConfig `yaml:"target"`
	}
	if err := n.Decode(&aux); err != nil {
		return err
	}
	*j = JoinConfig{Name: aux.Name, Type: aux.Type, Target: aux.Target}
	for _, sub := range []struct {
		key  string
		keys []string
	}{{"left", leftKeys}, {"target", targetKeys}} {
		if v := mappingValue(n, sub.key); v != nil {
			if err := checkKeys(v, sub.key, sub.keys); err != nil {
				return err
			}
		}
	}
	if aux.Left.Kind != 0 {
		if err := aux.Left.Decode(&j.Left); err != nil {
			return err
		}
	}
	switch aux.Right.Kind {
	case 0:
	case yaml.MappingNode:
		if err := checkKeys(&aux.Right, "right", rightKeys); err != nil {
			var ue *unknownKeyError
			if errors.As(err, &ue) && slices.Contains(rightEntryKeys, ue.key) {
				return fmt.Errorf("line %d: right.%s belongs to the list form of right (joins of more than two tables): "+
					"write right as a list of entries, or leave %s out", ue.line, ue.key, ue.key)
			}
			return err
		}
		if err := aux.Right.Decode(&j.Right); err != nil {
			return err
		}
	case yaml.SequenceNode:
		j.Rights = []RightConfig{}
		for _, e := range aux.Right.Content {
			if e.Kind != yaml.MappingNode {
				return fmt.Errorf("line %d: each entry of right must be a mapping with table, foreign_key, and optionally from, as, type, key, columns", e.Line)
			}
			if err := checkKeys(e, "an entry of right", rightEntryKeys); err != nil {
				return err
			}
			var r RightConfig
			if err := e.Decode(&r); err != nil {
				return err
			}
			j.Rights = append(j.Rights, r)
		}
	default:
		return fmt.Errorf("line %d: right must be a mapping (two tables) or a list of entries (more tables)", aux.Right.Line)
	}
	return nil
}

// unknownKeyError is a key that a mapping of the configuration does not
// take.
type unknownKeyError struct {
	line      int
	key, what string
	allowed   []string
}

func (e *unknownKeyError) Error() string {
	msg := fmt.Sprintf("line %d: %s has no key %q; use %s", e.line, e.what, e.key, strings.Join(e.allowed, ", "))
	if hint := unsupportedKeys[strings.ToLower(e.key)]; hint != "" {
		msg += " (" + hint + ")"
	}
	return msg
}

// unsupportedKeys names, for keys users write for what fkmat does not do,
// why and what to do instead.
var unsupportedKeys = map[string]string{
	"on":        nonEquality,
	"condition": nonEquality,
	"join_on":   nonEquality,
	"where":     nonEquality,
	"filter":    nonEquality,
	"group_by":  noAggregates,
	"aggregate": noAggregates,
	"having":    noAggregates,
}

const (
	nonEquality = "joins are on a foreign key equal to the referenced key only: conditions other than that equality " +
		"(non-equality joins, filters) are not supported; write foreign_key, and filter in a view over the target"
	noAggregates = "aggregates are not supported: fkmat maintains the rows of a join; aggregate in a view over the target"
)

// checkKeys fails on the first key of mapping n not in allowed.
func checkKeys(n *yaml.Node, what string, allowed []string) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: %s must be a mapping", n.Line, what)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i].Value; !slices.Contains(allowed, k) {
			return &unknownKeyError{line: n.Content[i].Line, key: k, what: what, allowed: allowed}
		}
	}
	return nil
}

// mappingValue returns the value of key in mapping n, or nil.
func mappingValue(n *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// LeftConfig is the referencing side (orders).
type LeftConfig struct {
	Table      TableName   `yaml:"table"`
	Key        []string    `yaml:"key"`
	ForeignKey []string    `yaml:"foreign_key"`
	Columns    []ColumnRef `yaml:"columns"`
}

// RightConfig is a referenced side (customers): the one of a two-table
// join, or an entry of the list form.
type RightConfig struct {
	Table   TableName   `yaml:"table"`
	Key     []string    `yaml:"key"`
	Columns []ColumnRef `yaml:"columns"`
	// The list form only (README, "Joins of more than two tables"):
	// From names the table holding the foreign key: the left table
	// (default) or an earlier entry, by its As or its table name.
	From string `yaml:"from"`
	// ForeignKey are From's columns referencing Key, in order.
	ForeignKey []string `yaml:"foreign_key"`
	// As names the entry (default: the table's name without schema).
	As string `yaml:"as"`
	// Type, inner or left, overrides the join's type for this edge.
	Type string `yaml:"type"`
}

// Alias returns the entry's name: As, or the table's name.
func (r RightConfig) Alias() string {
	if r.As != "" {
		return r.As
	}
	return r.Table.Name
}

// TargetConfig names the materialized table.
type TargetConfig struct {
	Table TableName `yaml:"table"`
}

// TableName is a schema-qualified table name. In the file it is written
// `table`, `schema.table`, or with double quotes for names that contain dots,
// quotes or spaces: `"My Schema"."Order ""Lines"""`. Names are exact (no case
// folding).
type TableName struct {
	Schema string
	Name   string
}

// String renders the name for messages (schema.table, quoted only where needed).
func (t TableName) String() string {
	return quoteIfNeeded(t.Schema) + "." + quoteIfNeeded(t.Name)
}

// IsZero reports whether no table was given.
func (t TableName) IsZero() bool { return t.Name == "" }

// UnmarshalYAML parses `schema.table`.
func (t *TableName) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return fmt.Errorf("line %d: table must be a string like public.orders", n.Line)
	}
	parsed, err := ParseTableName(s)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*t = parsed
	return nil
}

// ParseTableName parses `table` or `schema.table` (default schema public).
func ParseTableName(s string) (TableName, error) {
	parts, err := splitIdentifiers(strings.TrimSpace(s), '.')
	if err != nil {
		return TableName{}, fmt.Errorf("table %q: %w", s, err)
	}
	switch len(parts) {
	case 1:
		return TableName{Schema: "public", Name: parts[0]}, nil
	case 2:
		return TableName{Schema: parts[0], Name: parts[1]}, nil
	default:
		return TableName{}, fmt.Errorf("table %q: write it as schema.table (quote names containing dots)", s)
	}
}

// ColumnRef is one `columns` item: a source column and its output name.
type ColumnRef struct {
	Name  string
	Alias string // output column name; equals Name when no AS was given
}

var asSeparator = regexp.MustCompile(`(?i)\s+as\s+`)

// UnmarshalYAML parses `col` or `col AS alias`.
func (c *ColumnRef) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return fmt.Errorf("line %d: a column must be a string like \"name\" or \"name AS alias\"", n.Line)
	}
	parsed, err := ParseColumnRef(s)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*c = parsed
	return nil
}

// ParseColumnRef parses `col` or `col AS alias`; either side may be a
// double-quoted identifier.
func ParseColumnRef(s string) (ColumnRef, error) {
	s = strings.TrimSpace(s)
	nameText, aliasText := s, ""
	// Find " AS " outside double quotes.
	for _, loc := range asSeparator.FindAllStringIndex(s, -1) {
		if strings.Count(s[:loc[0]], `"`)%2 == 0 {
			nameText, aliasText = s[:loc[0]], s[loc[1]:]
			break
		}
	}
	if strings.Count(s, `"`) == 0 && strings.ContainsAny(nameText, "()*+-/|") {
		return ColumnRef{}, fmt.Errorf("column %q: expressions and aggregates (sum(x), count(*), a || b) are not supported; "+
			"list column names, optionally \"name AS alias\", and compute in a view over the target", s)
	}
	name, err := oneIdentifier(nameText)
	if err != nil {
		return ColumnRef{}, fmt.Errorf("column %q: %w", s, err)
	}
	alias := name
	if aliasText != "" {
		if alias, err = oneIdentifier(aliasText); err != nil {
			return ColumnRef{}, fmt.Errorf("column %q: alias: %w", s, err)
		}
	}
	return ColumnRef{Name: name, Alias: alias}, nil
}

// String renders the reference as written in the file.
func (c ColumnRef) String() string {
	if c.Alias == c.Name {
		return quoteIfNeeded(c.Name)
	}
	return quoteIfNeeded(c.Name) + " AS " + quoteIfNeeded(c.Alias)
}

func oneIdentifier(s string) (string, error) {
	parts, err := splitIdentifiers(strings.TrimSpace(s), 0)
	if err != nil {
		return "", err
	}
	if len(parts) != 1 {
		return "", errors.New("expected one name")
	}
	return parts[0], nil
}

// splitIdentifiers splits s on sep (0 = no splitting) outside double quotes,
// unquoting quoted parts ("" is a literal quote). Empty parts are errors.
func splitIdentifiers(s string, sep byte) ([]string, error) {
	var parts []string
	var cur strings.Builder
	quoted, wasQuoted := false, false
	flush := func() error {
		if cur.Len() == 0 && !wasQuoted {
			return errors.New("empty name")
		}
		if cur.Len() == 0 {
			return errors.New(`empty quoted name ""`)
		}
		parts = append(parts, cur.String())
		cur.Reset()
		wasQuoted = false
		return nil
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case quoted && ch == '"' && i+1 < len(s) && s[i+1] == '"':
			cur.WriteByte('"')
			i++
		case quoted && ch == '"':
			quoted = false
		case quoted:
			cur.WriteByte(ch)
		case ch == '"':
			if cur.Len() > 0 {
				return nil, errors.New("a quote must start the name")
			}
			quoted, wasQuoted = true, true
		case sep != 0 && ch == sep:
			if err := flush(); err != nil {
				return nil, err
			}
		default:
			if wasQuoted {
				return nil, errors.New("text after a closing quote")
			}
			cur.WriteByte(ch)
		}
	}
	if quoted {
		return nil, errors.New("unterminated double quote")
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return parts, nil
}

var plainIdent = regexp.MustCompile(`^[a-z_][a-z0-9_$]*$`)

func quoteIfNeeded(s string) string {
	if plainIdent.MatchString(s) {
		return s
	}
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// LoadConfig reads and parses a configuration file.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &ConfigError{Problems: []string{fmt.Sprintf("read config file: %v", err)}}
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			for i := range ce.Problems {
				ce.Problems[i] = path + ": " + ce.Problems[i]
			}
		}
		return nil, err
	}
	return cfg, nil
}

// ParseConfig parses YAML; unknown keys are errors (a typo must not be
// silently ignored).
func ParseConfig(data []byte) (*Config, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var cfg Config
	if err := dec.Decode(&cfg); err != nil {
		return nil, &ConfigError{Problems: []string{"malformed YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}}
	}
	return &cfg, nil
}

// ConfigError lists every problem found in a configuration, each naming its
// fix. Commands exit with code 2 on it.
type ConfigError struct {
	Problems []string
}

func (e *ConfigError) Error() string {
	if len(e.Problems) == 1 {
		return "configuration: " + e.Problems[0]
	}
	return "configuration has " + fmt.Sprint(len(e.Problems)) + " problems:\n  - " + strings.Join(e.Problems, "\n  - ")
}

var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// ApplyDefaults fills in what the file may omit: target = source, slot
// fkmat_<first join name>, publication = slot, join type lower-cased.
func (c *Config) ApplyDefaults() {
	if c.Target == "" {
		c.Target = c.Source
	}
	if c.Slot == "" && len(c.Joins) > 0 {
		c.Slot = "fkmat_" + strings.Trim(nonSlot.ReplaceAllString(strings.ToLower(c.Joins[0].Name), "_"), "_")
		if len(c.Slot) > 63 {
			c.Slot = c.Slot[:63]
		}
	}
	if c.Publication == "" {
		c.Publication = c.Slot
	}
	for i := range c.Joins {
		c.Joins[i].Type = strings.ToLower(strings.TrimSpace(c.Joins[i].Type))
		for k := range c.Joins[i].Rights {
			r := &c.Joins[i].Rights[k]
			if r.Type = strings.ToLower(strings.TrimSpace(r.Type)); r.Type == "" {
				r.Type = c.Joins[i].Type
			}
		}
	}
}

var nonSlot = regexp.MustCompile(`[^a-z0-9_]+`)

// joinName keeps join names safe inside Redis key prefixes and patterns.
var joinName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$`)

// Validate checks what can be checked without a database and reports every
// problem at once as a *ConfigError. Catalog checks (tables, columns, types,
// keys) happen in Resolve.
func (c *Config) Validate() error {
	var p []string
	add := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }
	if c.Source == "" {
		add("no source database: set `source:` in the file, FKMAT_SOURCE_URL, or --source")
	}
	for _, u := range []struct{ what, val, scheme string }{
		{"source", c.Source, "postgres"}, {"target", c.Target, "postgres"}, {"redis", c.Redis, "redis"},
	} {
		if u.val != "" {
			if err := checkURL(u.val, u.scheme); err != nil {
				add("%s URL %s: %v", u.what, RedactURL(u.val), err)
			}
		}
	}
	if c.Redis == "" {
		add("no Redis: set `redis:` in the file, FKMAT_REDIS_URL, or --redis (e.g. redis://localhost:6379/0)")
	}
	if !slotName.MatchString(c.Slot) {
		add("slot %q: use 1-63 lowercase letters, digits or underscores", c.Slot)
	}
	if c.Publication == "" {
		add("publication name is empty")
	}
	if len(c.Joins) == 0 {
		add("no joins: add at least one entry under `joins:`")
	}
	names := map[string]bool{}
	targets := map[TableName]string{}
	for i, j := range c.Joins {
		where := fmt.Sprintf("joins[%d]", i)
		if j.Name != "" {
			where = fmt.Sprintf("join %q", j.Name)
		}
		if j.Name == "" {
			add("%s: set `name:`", where)
		} else if !joinName.MatchString(j.Name) {
			add("%s: a join name may hold letters, digits, '_', '.' and '-' (at most 63); rename it", where)
		} else if names[j.Name] {
			add("%s: duplicate join name; give each join a unique name", where)
		}
		names[j.Name] = true
		if j.Type != JoinInner && j.Type != JoinLeft {
			add("%s: type %q is not a join type; use `type: inner` or `type: left`", where, j.Type)
		}
		if j.Left.Table.IsZero() {
			add("%s: set left.table", where)
		}
		if j.IsList() {
			for _, prob := range validateList(j) {
				add("%s: %s", where, prob)
			}
		} else if j.Right.Table.IsZero() {
			add("%s: set right.table", where)
		}
		if j.Target.Table.IsZero() {
			add("%s: set target.table", where)
		} else if other, dup := targets[j.Target.Table]; dup {
			add("%s: target table %s is also the target of join %q; use one target per join", where, j.Target.Table, other)
		} else {
			targets[j.Target.Table] = j.Name
		}
		if !j.Target.Table.IsZero() && slices.Contains(j.Tables(), j.Target.Table) {
			add("%s: target.table %s is a source table; choose another target", where, j.Target.Table)
		}
		for _, d := range duplicates(j.Left.Key) {
			add("%s: left.key lists %q twice", where, d)
		}
		if j.IsList() {
			continue
		}
		if len(j.Left.ForeignKey) == 0 {
			add("%s: set left.foreign_key (the left columns that reference right.key)", where)
		}
		if len(j.Right.Key) > 0 && len(j.Left.ForeignKey) > 0 && len(j.Right.Key) != len(j.Left.ForeignKey) {
			add("%s: left.foreign_key has %d columns but right.key has %d; they must match in number and order",
				where, len(j.Left.ForeignKey), len(j.Right.Key))
		}
		for _, d := range duplicates(j.Left.ForeignKey) {
			add("%s: left.foreign_key lists %q twice", where, d)
		}
		for _, d := range duplicates(j.Right.Key) {
			add("%s: right.key lists %q twice", where, d)
		}
	}
	if len(p) > 0 {
		return &ConfigError{Problems: p}
	}
	return nil
}

// Tables returns the join's source tables: the left table, then each
// right table (once each, in order).
func (j JoinConfig) Tables() []TableName {
	out := []TableName{j.Left.Table}
	rights := j.Rights
	if !j.IsList() {
		rights = []RightConfig{j.Right}
	}
	for _, r := range rights {
		if !r.Table.IsZero() && !slices.Contains(out, r.Table) {
			out = append(out, r.Table)
		}
	}
	return out
}

// ParentOf returns the index of the entry that entry i's From names (-1:
// the left table), or an error naming the fix. The left table answers to
// its name and schema.name; an entry to its As, or when it has none to its
// table's name and schema.name.
func (j JoinConfig) ParentOf(i int) (int, error) {
	r := j.Rights[i]
	if r.From == "" {
		return -1, nil
	}
	names := func(k int) []string {
		if k < 0 {
			return []string{j.Left.Table.Name, j.Left.Table.String(), j.Left.Table.Schema + "." + j.Left.Table.Name}
		}
		e := j.Rights[k]
		if e.As != "" {
			return []string{e.As}
		}
		return []string{e.Table.Name, e.Table.String(), e.Table.Schema + "." + e.Table.Name}
	}
	var found []int
	for k := -1; k < len(j.Rights); k++ {
		if slices.Contains(names(k), r.From) {
			found = append(found, k)
		}
	}
	if len(found) == 0 {
		// No name matches: a table name reaches an entry renamed by as
		// (from takes an as name or a table name).
		for k, e := range j.Rights {
			if e.As != "" && slices.Contains([]string{e.Table.Name, e.Table.String(), e.Table.Schema + "." + e.Table.Name}, r.From) {
				found = append(found, k)
			}
		}
	}
	var earlier []string
	earlier = append(earlier, j.Left.Table.Name)
	for k := range i {
		earlier = append(earlier, j.Rights[k].Alias())
	}
	switch {
	case len(found) == 0:
		return 0, fmt.Errorf("from %q names no table of this join; use the left table or an earlier entry: %s", r.From, strings.Join(earlier, ", "))
	case len(found) > 1:
		return 0, fmt.Errorf("from %q is ambiguous: %d tables of this join answer to it; give the one you mean an `as` name and use that", r.From, len(found))
	case found[0] == i:
		return 0, fmt.Errorf("from %q names the entry itself: a table cannot reference itself through one edge (a cycle); name the left table or an earlier entry", r.From)
	case found[0] > i:
		return 0, fmt.Errorf("from %q names an entry listed after this one: joins form a tree read in list order (no cycles); move %q above this entry", r.From, r.From)
	}
	return found[0], nil
}

// validateList checks the list form of right: what needs no database.
// MaxEntries is the most entries a join of more than two tables may have:
// the Redis state numbers them in a byte.
const MaxEntries = 255

func validateList(j JoinConfig) []string {
	var p []string
	add := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }
	if len(j.Left.ForeignKey) > 0 {
		add("left.foreign_key belongs to the two-table form; with right as a list, give each entry its foreign_key (the columns of its `from` table)")
	}
	if len(j.Rights) == 0 {
		add("right is an empty list; add one entry per joined table")
	}
	if len(j.Rights) > MaxEntries {
		add("right has %d entries, at most %d are supported; split the join into several joins", len(j.Rights), MaxEntries)
	}
	seen := map[string]int{strings.ToLower(j.Left.Table.Name): -1}
	for i, r := range j.Rights {
		where := fmt.Sprintf("right[%d]", i)
		if !r.Table.IsZero() {
			where += " (" + r.Alias() + ")"
		}
		if r.Table.IsZero() {
			add("%s: set table", where)
			continue
		}
		if r.As != "" && !joinName.MatchString(r.As) {
			add("%s: as %q may hold letters, digits, '_', '.' and '-' (at most 63); rename it", where, r.As)
		}
		if k, dup := seen[strings.ToLower(r.Alias())]; dup {
			other := "the left table"
			if k >= 0 {
				other = fmt.Sprintf("right[%d]", k)
			}
			add("%s: the name %q is taken by %s; give this entry a distinct `as` (a table joined twice needs one)", where, r.Alias(), other)
		} else {
			seen[strings.ToLower(r.Alias())] = i
		}
		switch strings.ToLower(strings.TrimSpace(r.Type)) {
		case "", JoinInner, JoinLeft:
		default:
			add("%s: type %q is not a join type; use `type: inner` or `type: left` (or leave it out for the join's type)", where, r.Type)
		}
		if len(r.ForeignKey) == 0 {
			add("%s: set foreign_key (the columns of %s that reference %s)", where, fromName(j, r), r.Table)
		}
		if len(r.Key) > 0 && len(r.ForeignKey) > 0 && len(r.Key) != len(r.ForeignKey) {
			add("%s: foreign_key has %d columns but key has %d; they must match in number and order", where, len(r.ForeignKey), len(r.Key))
		}
		for _, d := range duplicates(r.Key) {
			add("%s: key lists %q twice", where, d)
		}
		for _, d := range duplicates(r.ForeignKey) {
			add("%s: foreign_key lists %q twice", where, d)
		}
		if _, err := j.ParentOf(i); err != nil {
			add("%s: %v", where, err)
		}
	}
	return p
}

// fromName names the table an entry's foreign key is in, for messages.
func fromName(j JoinConfig, r RightConfig) string {
	if r.From == "" {
		return j.Left.Table.String()
	}
	return r.From
}

func duplicates(names []string) []string {
	seen := map[string]bool{}
	var d []string
	for _, n := range names {
		if seen[n] {
			d = append(d, n)
		}
		seen[n] = true
	}
	return d
}

func checkURL(raw, scheme string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("not a URL")
	}
	switch scheme {
	case "postgres":
		if u.Scheme != "postgres" && u.Scheme != "postgresql" {
			return errors.New("must start with postgres://")
		}
	case "redis":
		switch u.Scheme {
		case "redis", "rediss", "redis+cluster", "rediss+cluster":
		default:
			return errors.New("must start with redis://, rediss:// (one server), redis+cluster:// or rediss+cluster:// (a Redis Cluster)")
		}
	}
	return nil
}

// RedactURL replaces the password of a URL (and a password= query parameter)
// with "xxxxx", for logs and errors.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	q := u.Query()
	if q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// passwordOf returns the password in a URL (user info or password=
// parameter), or "".
func PasswordOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	if pw, ok := u.User.Password(); ok {
		return pw
	}
	return u.Query().Get("password")
}
