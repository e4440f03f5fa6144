package config

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
)

// Join types.
const (
	JoinInner = "inner"
	JoinLeft  = "left"
)

// Config is the user's join definition: connections, slot and the joins it
// maintains. Load it with Load (or LoadConfig or ParseConfig, then apply
// flag/env overrides, then call Validate). Each field is the key of the
// same name in the file, in snake case (foreign_key for ForeignKey);
// decode.go reads them.
type Config struct {
	Source      string
	Target      string
	Redis       string
	Slot        string
	Publication string
	// TimeZone is the TimeZone setting of fkmat's Postgres sessions, under
	// which filters and computed columns are evaluated (default UTC).
	TimeZone string
	Joins    []JoinConfig

	// unread holds the keys of the file whose values could not be read,
	// or were misspelled ("0/left.foreign_key": of joins[0]; "-1/joins":
	// at the top level): their problems are reported, and Validate does
	// not report them missing as well.
	unread map[string]bool
}

// reported reports whether key of join i (-1: the top level), or the
// mapping holding it, has had its problem reported while reading the file.
func (c *Config) reported(i int, key string) bool {
	parent, _, _ := strings.Cut(key, ".")
	return c.unread[fmt.Sprintf("%d/%s", i, key)] || c.unread[fmt.Sprintf("%d/%s", i, parent)]
}

// JoinConfig defines one foreign-key join: of two tables (`right:` a
// mapping, held in Right), or of more (`right:` a list, held in Rights; README,
// "Joins of more than two tables").
type JoinConfig struct {
	Name   string
	Type   string
	Left   LeftConfig
	Right  RightConfig
	Target TargetConfig
	// Rights is the list form's entries, in order; nil in the two-table
	// form.
	Rights []RightConfig
	// Rollups are the child tables rolled up into the left table's rows.
	Rollups []RollupConfig
}

// IsList reports whether the join uses the list form of `right:`.
func (j JoinConfig) IsList() bool { return j.Rights != nil }

// LeftConfig is the referencing side (orders).
type LeftConfig struct {
	Table      TableName
	Key        []string
	ForeignKey []string
	Columns    []ColumnRef
	// Where filters the table's rows before the join: a SQL boolean
	// expression over its own columns ("" keeps every row).
	Where string
}

// RightConfig is a referenced side (customers): the one of a two-table
// join, or an entry of the list form.
type RightConfig struct {
	Table   TableName
	Key     []string
	Columns []ColumnRef
	// Where filters the table's rows before the join (LeftConfig.Where).
	Where string
	// The list form only (README, "Joins of more than two tables"):
	// From names the table holding the foreign key: the left table
	// (default) or an earlier entry, by its As or its table name.
	From string
	// ForeignKey are From's columns referencing Key, in order.
	ForeignKey []string
	// As names the entry (default: the table's name without schema).
	As string
	// Type, inner or left, overrides the join's type for this edge.
	Type string
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
	Table TableName
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

// ColumnRef is one `columns` item: a source column, or a SQL expression
// over the table's columns, and its output name.
type ColumnRef struct {
	Name  string // the source column; "" for an expression
	Alias string // output column name; equals Name when no AS was given
	// Expr is the item's SQL scalar expression (`amount * qty AS total`),
	// "" for a column.
	Expr string
}

// ParseColumnRef parses `col`, `col AS alias` (either side may be a
// double-quoted identifier) or `expression AS alias`.
func ParseColumnRef(s string) (ColumnRef, error) {
	s = strings.TrimSpace(s)
	nameText, aliasText := s, ""
	if at, end := topLevelAs(s); at >= 0 {
		nameText, aliasText = strings.TrimSpace(s[:at]), s[end:]
	}
	name, err := oneIdentifier(nameText)
	if err != nil || looksLikeExpression(nameText) {
		if aliasText == "" {
			if looksLikeExpression(nameText) {
				return ColumnRef{}, fmt.Errorf("column %q: name the expression's output column with AS, e.g. %q", s, nameText+" AS total")
			}
			return ColumnRef{}, fmt.Errorf("column %q: %w", s, err)
		}
		if strings.TrimSpace(nameText) == "" {
			return ColumnRef{}, fmt.Errorf("column %q: nothing before AS", s)
		}
		alias, err := oneIdentifier(aliasText)
		if err != nil {
			return ColumnRef{}, fmt.Errorf("column %q: alias: %w", s, err)
		}
		return ColumnRef{Alias: alias, Expr: nameText}, nil
	}
	alias := name
	if aliasText != "" {
		if alias, err = oneIdentifier(aliasText); err != nil {
			return ColumnRef{}, fmt.Errorf("column %q: alias: %w", s, err)
		}
	}
	return ColumnRef{Name: name, Alias: alias}, nil
}

// looksLikeExpression reports whether s is more than a name: it holds an
// operator, a call, a cast or a space outside double quotes.
func looksLikeExpression(s string) bool {
	return strings.Count(s, `"`) == 0 && strings.ContainsAny(s, "()*+-/|:' <>=")
}

// topLevelAs finds the last " AS " of s outside quotes, parentheses and
// brackets: the start of its leading space and the end of its trailing
// one, or -1.
func topLevelAs(s string) (at, end int) {
	at = -1
	scanTopLevel(s, 0, func(i, depth int) bool {
		if depth == 0 && isSpace(s[i]) && i+3 < len(s) && strings.EqualFold(s[i+1:i+3], "as") && isSpace(s[i+3]) {
			j := i + 3
			for j < len(s) && isSpace(s[j]) {
				j++
			}
			at, end = i, j
		}
		return false
	})
	return at, end
}

// scanTopLevel calls fn for each byte of s from start that is outside
// quotes, with the depth of parentheses and brackets after it, until fn
// says stop; it returns where fn stopped, or -1.
func scanTopLevel(s string, start int, fn func(i, depth int) bool) int {
	depth := 0
	var quote byte
	for i := start; i < len(s); i++ {
		switch ch := s[i]; {
		case quote != 0:
			if ch == quote {
				quote = 0
			}
			continue
		case ch == '"' || ch == '\'':
			quote = ch
			continue
		case ch == '(' || ch == '[':
			depth++
		case ch == ')' || ch == ']':
			depth--
		}
		if fn(i, depth) {
			return i
		}
	}
	return -1
}

func isSpace(ch byte) bool { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' }

// String renders the reference as written in the file.
func (c ColumnRef) String() string {
	switch {
	case c.Expr != "":
		return c.Expr + " AS " + quoteIfNeeded(c.Alias)
	case c.Alias == c.Name:
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

// Load reads the configuration file at path, lets override apply flags
// and environment variables over it, fills in the defaults and validates the
// result. Every problem of the file and of the result comes back at once, in
// a *ConfigError.
func Load(path string, override func(*Config)) (*Config, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	cfg, problems := parse(data)
	problems = inFile(path, problems)
	if cfg == nil {
		return nil, &ConfigError{Problems: problems}
	}
	if override != nil {
		override(cfg)
	}
	cfg.ApplyDefaults()
	if problems = append(problems, cfg.problems()...); len(problems) > 0 {
		return nil, &ConfigError{Problems: problems}
	}
	return cfg, nil
}

// LoadConfig reads and parses a configuration file.
func LoadConfig(path string) (*Config, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	cfg, problems := parse(data)
	if len(problems) > 0 {
		return nil, &ConfigError{Problems: inFile(path, problems)}
	}
	return cfg, nil
}

// ParseConfig parses YAML. Every unknown key and every value of the wrong
// shape is an error (a typo must not be silently ignored), reported
// together in a *ConfigError.
func ParseConfig(data []byte) (*Config, error) {
	cfg, problems := parse(data)
	if len(problems) > 0 {
		return nil, &ConfigError{Problems: problems}
	}
	return cfg, nil
}

func readFile(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &ConfigError{Problems: []string{fmt.Sprintf("read config file: %v; check the path given to --config (-c) or FKMAT_CONFIG", err)}}
	}
	return data, nil
}

// inFile prefixes problems with the file's path.
func inFile(path string, problems []string) []string {
	for i := range problems {
		problems[i] = path + ": " + problems[i]
	}
	return problems
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
	if p := c.problems(); len(p) > 0 {
		return &ConfigError{Problems: p}
	}
	return nil
}

// problems lists what Validate reports.
func (c *Config) problems() []string {
	var p []string
	add := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }
	if c.Source == "" && !c.reported(-1, "source") {
		add("no source database: set `source:` in the file, FKMAT_SOURCE_URL, or --source")
	}
	for _, u := range []struct {
		what, val string
		check     func(string) error
	}{{"source", c.Source, checkPostgres}, {"target", c.Target, checkPostgres}, {"redis", c.Redis, checkRedis}} {
		// A target that defaults to the source has the source's problem.
		if u.val != "" && (u.what != "target" || c.Target != c.Source) {
			if err := u.check(u.val); err != nil {
				add("%s %q: %v", u.what, RedactURL(u.val), err)
			}
		}
	}
	if c.Redis == "" && !c.reported(-1, "redis") {
		add("no Redis: set `redis:` in the file, FKMAT_REDIS_URL, or --redis (e.g. redis://localhost:6379/0)")
	}
	// With no joins there is no default slot; "no joins" says what to do.
	if c.Slot != "" || len(c.Joins) > 0 {
		if !slotName.MatchString(c.Slot) {
			add("slot %q: use 1-63 lowercase letters, digits or underscores, e.g. fkmat_shop", c.Slot)
		}
		if c.Publication == "" {
			add("publication name is empty: set `publication:`, or leave it out for the slot's name")
		}
	}
	if len(c.Joins) == 0 && !c.reported(-1, "joins") {
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
			if !c.reported(i, "name") {
				add("%s: set `name:`", where)
			}
		} else if !joinName.MatchString(j.Name) {
			add("%s: a join name may hold letters, digits, '_', '.' and '-' (at most 63); rename it", where)
		} else if names[j.Name] {
			add("%s: duplicate join name; give each join a unique name", where)
		}
		names[j.Name] = true
		if j.Type != JoinInner && j.Type != JoinLeft && !c.reported(i, "type") {
			add("%s: type %q is not a join type; use `type: inner` or `type: left`", where, j.Type)
		}
		if j.Left.Table.IsZero() && !c.reported(i, "left.table") {
			add("%s: set left.table", where)
		}
		if j.IsList() {
			for _, prob := range validateList(j, func(key string) bool { return c.reported(i, key) }) {
				add("%s: %s", where, prob)
			}
		} else if j.Right.Table.IsZero() && len(j.Rollups) == 0 && !c.reported(i, "right.table") {
			add("%s: set right.table (or roll child tables up with rollups:)", where)
		}
		for k, r := range j.Rollups {
			for _, prob := range validateRollup(r, fmt.Sprintf("rollups[%d].", k), func(key string) bool { return c.reported(i, key) }) {
				add("%s: %s", where, prob)
			}
		}
		if j.Target.Table.IsZero() {
			if !c.reported(i, "target.table") {
				add("%s: set target.table", where)
			}
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
		if j.IsList() || j.Right.Table.IsZero() {
			continue
		}
		if len(j.Left.ForeignKey) == 0 && !c.reported(i, "left.foreign_key") {
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
	return p
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
	for _, r := range j.Rollups {
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
	found := j.fromMatches(i)
	var earlier []string
	earlier = append(earlier, j.Left.Table.Name)
	for k := range i {
		earlier = append(earlier, j.Rights[k].Alias())
	}
	switch {
	case len(found) == 0:
		var all []string
		for _, e := range j.Rights {
			all = append(all, e.Alias())
		}
		if near := closest(r.From, all); near != "" {
			k := slices.IndexFunc(j.Rights, func(e RightConfig) bool { return e.Alias() == near })
			return 0, fmt.Errorf("from %q names no table of this join: did you mean %q (right[%d], table %s)? If that entry's table is "+
				"the misspelled name, fix it there", r.From, near, k, j.Rights[k].Table)
		}
		return 0, fmt.Errorf("from %q names no table of this join; use the left table or an earlier entry: %s", r.From, strings.Join(earlier, ", "))
	case len(found) > 1:
		return 0, fmt.Errorf("from %q is ambiguous: %d tables of this join answer to it; give the one you mean an `as` name and use that", r.From, len(found))
	case found[0] == i:
		return 0, fmt.Errorf("from %q names the entry itself: a table cannot reference itself through one edge (a cycle); name the left table or an earlier entry", r.From)
	case found[0] > i:
		if cycle := j.cycleThrough(i); cycle != nil {
			return 0, fmt.Errorf("from %q closes a cycle: %s (each follows the entry its from names); joins form a tree from the left table: "+
				"make one of them reference the left table or an entry outside the cycle", r.From, strings.Join(cycle, " → "))
		}
		return 0, fmt.Errorf("from %q names an entry listed after this one: joins form a tree read in list order (no cycles); move %q above this entry", r.From, r.From)
	}
	return found[0], nil
}

// fromMatches returns the tables of the join (-1: the left table, k: entry
// k) that entry i's from names: by as, or by table name (an entry renamed
// by as answers to its table's name only when nothing else does).
func (j JoinConfig) fromMatches(i int) []int {
	from := j.Rights[i].From
	tableNames := func(t TableName) []string { return []string{t.Name, t.String(), t.Schema + "." + t.Name} }
	var found []int
	if slices.Contains(tableNames(j.Left.Table), from) {
		found = append(found, -1)
	}
	for k, e := range j.Rights {
		if (e.As != "" && e.As == from) || (e.As == "" && slices.Contains(tableNames(e.Table), from)) {
			found = append(found, k)
		}
	}
	if len(found) == 0 {
		for k, e := range j.Rights {
			if e.As != "" && slices.Contains(tableNames(e.Table), from) {
				found = append(found, k)
			}
		}
	}
	return found
}

// cycleThrough returns the entries' names along the from links starting
// at entry i when they lead back to it (customers → regions → customers),
// nil when they do not.
func (j JoinConfig) cycleThrough(i int) []string {
	path := []string{j.Rights[i].Alias()}
	seen := map[int]bool{i: true}
	for k := i; ; {
		if j.Rights[k].From == "" {
			return nil
		}
		found := j.fromMatches(k)
		if len(found) != 1 || found[0] < 0 {
			return nil
		}
		k = found[0]
		path = append(path, j.Rights[k].Alias())
		if k == i {
			return path
		}
		if seen[k] {
			return nil // a cycle that does not pass through i
		}
		seen[k] = true
	}
}

// MaxEntries is the most entries a join of more than two tables may have:
// the Redis state numbers them in a byte.
const MaxEntries = 255

// validateList checks the list form of right: what needs no database.
// reported tells whether a key of the join (right[0].table) has had its
// problem reported while reading the file.
func validateList(j JoinConfig, reported func(key string) bool) []string {
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
			if !reported(fmt.Sprintf("right[%d].table", i)) {
				add("%s: set table", where)
			}
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
		switch t := strings.ToLower(strings.TrimSpace(r.Type)); {
		case t == "", t == JoinInner, t == JoinLeft, t == j.Type: // the join's type is checked once, for the join
		default:
			add("%s: type %q is not a join type; use `type: inner` or `type: left` (or leave it out for the join's type)", where, r.Type)
		}
		if len(r.ForeignKey) == 0 && !reported(fmt.Sprintf("right[%d].foreign_key", i)) {
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
