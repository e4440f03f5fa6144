package config

import (
	"strings"
	"testing"
)

// TestCheckConnStrings: Postgres takes a URL or a keyword/value string, as
// pgx does; Redis a URL. A refusal shows how to write it.
func TestCheckConnStrings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		check func(string) error
		raw   string
		want  string // "" = accepted; else a fragment of the error
	}{
		{checkPostgres, "postgres://app:pw@db:5432/shop?sslmode=disable", ""},
		{checkPostgres, "postgresql://db/shop", ""},
		{checkPostgres, "host=db port=5432 dbname=shop user=app password='a b'", ""},
		{checkPostgres, "dbname=shop", ""},
		{checkPostgres, "db:5432", "write it like postgres://app@db:5432/shop, or as keywords: host=db port=5432 dbname=shop user=app"},
		{checkPostgres, "[::1]:5432", "host=::1 port=5432"},
		{checkPostgres, "mysql://db/shop", "a URL must start with postgres:// or postgresql://"},
		{checkPostgres, "host=db password='s3cret", "unterminated quoted string"},
		{checkPostgres, "host=db port=notaport", "invalid port"},
		{checkRedis, "redis://localhost:6379/0", ""},
		{checkRedis, "rediss+cluster://u:pw@r1:7000,r2:7000", ""},
		{checkRedis, "127.0.0.1:6379", "not a URL; write it like redis://127.0.0.1:6379/0"},
		{checkRedis, "cache", "redis://cache:6379/0"},
		{checkRedis, "http://localhost:6379", "must start with redis://"},
		{checkRedis, "redis://u:s3cret@localhost:port/0", "cannot be parsed"},
	} {
		err := tc.check(tc.raw)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v, want it accepted", tc.raw, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: %v, want an error containing %q", tc.raw, err, tc.want)
		case err != nil && strings.Contains(err.Error(), "s3cret"):
			t.Errorf("%q: the error shows the password: %v", tc.raw, err)
		}
	}
}

func TestRedactKeywordValue(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"host=db password=s3cret user=app":              "host=db password=xxxxx user=app",
		"password = s3cret host=db":                     "password = xxxxx host=db",
		`host=db password='s3 cr\'et' user=app`:         "host=db password=xxxxx user=app",
		"host=db sslpassword=s3cret":                    "host=db sslpassword=xxxxx",
		"host=db user=app":                              "host=db user=app",
		"app:s3cret@db:5432/shop":                       "app:xxxxx@db:5432/shop",
		"postgres://app:s3cret@db:notaport/shop":        "postgres://app:xxxxx@db:notaport/shop",
		"postgres://app:s3c@ret@db:notaport/shop":       "postgres://app:xxxxx@db:notaport/shop",
		"postgres://db:bad/x?password=s3cret&sslmode=x": "postgres://db:bad/x?password=xxxxx&sslmode=x",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{
		"host=db password=s3cret user=app":       "s3cret",
		`host=db password='s3 cr\'et' user=app`:  "s3 cr'et",
		"host=db sslpassword=other password=pw":  "pw",
		"host=db":                                "",
		"postgres://app:s3cret@db/shop":          "s3cret",
		"postgres://app:s3cret@db:notaport/shop": "s3cret",
	} {
		if got := PasswordOf(in); got != want {
			t.Errorf("PasswordOf(%q) = %q, want %q", in, got, want)
		}
	}
}
