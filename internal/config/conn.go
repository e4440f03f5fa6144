package config

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// A Postgres connection string is a URL (postgres://user@host/db) or a
// libpq keyword/value string (host=db dbname=shop user=app), as pgx takes
// both; a Redis one is a URL.

const (
	postgresExamples = "write it like postgres://app@localhost:5432/shop, or as keywords: host=localhost port=5432 dbname=shop user=app"
	redisForms       = "redis://, rediss:// (one server), redis+cluster:// or rediss+cluster:// (a Redis Cluster)"
)

// hostPort is what users write when they leave out the scheme: a host
// name, IPv4 or [IPv6] address, and perhaps a port.
var hostPort = regexp.MustCompile(`^([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::(\d+))?$`)

// checkPostgres checks a Postgres connection string as pgx will read it.
func checkPostgres(raw string) error {
	isURL := strings.Contains(raw, "://")
	switch {
	case isURL && !strings.HasPrefix(raw, "postgres://") && !strings.HasPrefix(raw, "postgresql://"):
		return errors.New("a URL must start with postgres:// or postgresql://; " + postgresExamples)
	case !isURL && !strings.Contains(raw, "="):
		if m := hostPort.FindStringSubmatch(raw); m != nil {
			keywords := "host=" + strings.Trim(m[1], "[]")
			if m[2] != "" {
				keywords += " port=" + m[2]
			}
			return fmt.Errorf("not a connection string; write it like postgres://app@%s/shop, or as keywords: %s dbname=shop user=app", raw, keywords)
		}
		return errors.New("not a connection string; " + postgresExamples)
	}
	if _, err := pgconn.ParseConfig(raw); err != nil {
		return fmt.Errorf("%s; %s", parseError(err, raw), postgresExamples)
	}
	return nil
}

// parseError is what pgconn found wrong in raw, without raw (shown
// redacted by the caller) or its password.
func parseError(err error, raw string) string {
	msg := err.Error()
	var pce *pgconn.ParseConfigError
	if errors.As(err, &pce) {
		// "cannot parse `<connection string>`: <what>"
		if i := strings.LastIndex(msg, "`: "); i >= 0 {
			msg = msg[i+len("`: "):]
		}
	}
	if pw := PasswordOf(raw); pw != "" {
		msg = strings.ReplaceAll(msg, pw, "xxxxx")
	}
	return msg
}

// checkRedis checks a Redis URL's form; the daemon parses the rest.
func checkRedis(raw string) error {
	if !strings.Contains(raw, "://") {
		example := "localhost:6379"
		if m := hostPort.FindStringSubmatch(raw); m != nil {
			example = m[1] + ":6379"
			if m[2] != "" {
				example = raw
			}
		}
		return fmt.Errorf("not a URL; write it like redis://%s/0 (one server) or redis+cluster://host1:7000,host2:7000 (a Redis Cluster)", example)
	}
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error quotes the URL, password included
		}
		return fmt.Errorf("cannot be parsed: %v; write it like redis://localhost:6379/0", err)
	}
	switch u.Scheme {
	case "redis", "rediss", "redis+cluster", "rediss+cluster":
		return nil
	}
	return errors.New("must start with " + redisForms)
}

var (
	// keywordPassword is a password (or sslpassword) in a keyword/value
	// string: quoted with backslash escapes, or up to the next space.
	keywordPassword = regexp.MustCompile(`(?i)((?:^|\s)(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'?|(?:[^\s\\]|\\.)*)`)
	// userPassword is the password of user:password@host, for strings
	// net/url refuses; it runs to the last @.
	userPassword = regexp.MustCompile(`^((?:[A-Za-z][A-Za-z0-9+.-]*://)?[^\s:@/]*:).*@`)
	// queryPassword is a password= parameter of such strings.
	queryPassword = regexp.MustCompile(`(?i)([?&](?:ssl)?password=)[^&#]*`)
)

// RedactURL replaces the passwords of a connection string with "xxxxx",
// for logs and errors: of a URL (user info, password= parameter), of a
// keyword/value string (password=...), and of strings that are neither,
// as far as they can be told.
func RedactURL(raw string) string {
	if !strings.Contains(raw, "://") {
		raw = keywordPassword.ReplaceAllString(raw, "${1}xxxxx")
		return userPassword.ReplaceAllString(raw, "${1}xxxxx@")
	}
	u, err := url.Parse(raw)
	if err != nil {
		raw = userPassword.ReplaceAllString(raw, "${1}xxxxx@")
		return queryPassword.ReplaceAllString(raw, "${1}xxxxx")
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	q := u.Query()
	for _, k := range []string{"password", "sslpassword"} {
		if q.Has(k) {
			q.Set(k, "xxxxx")
			u.RawQuery = q.Encode()
		}
	}
	return u.String()
}

// PasswordOf returns the password in a connection string (a URL's user
// info or password= parameter, a keyword/value string's password=), or "".
func PasswordOf(raw string) string {
	if !strings.Contains(raw, "://") {
		for _, m := range keywordPassword.FindAllStringSubmatch(raw, -1) {
			if strings.HasPrefix(strings.ToLower(strings.TrimSpace(m[1])), "password") {
				return unquoteKeyword(m[2])
			}
		}
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil {
		if m := userPassword.FindStringSubmatch(raw); m != nil {
			return strings.TrimSuffix(strings.TrimPrefix(m[0], m[1]), "@")
		}
		return ""
	}
	if pw, ok := u.User.Password(); ok {
		return pw
	}
	return u.Query().Get("password")
}

// unquoteKeyword undoes the quoting of a keyword/value string's value.
func unquoteKeyword(v string) string {
	if strings.HasPrefix(v, "'") {
		v = strings.TrimSuffix(v[1:], "'")
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] == '\\' && i+1 < len(v) {
			i++
		}
		b.WriteByte(v[i])
	}
	return b.String()
}
