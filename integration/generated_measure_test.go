package integration

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
)

// TestMeasureGeneratedColumns times the catch-up of a backlog of
// single-row update transactions on a table whose join outputs a generated
// column, against the same table with a plain column in its place, run by
// run (A B A B). FKMAT_MEASURE_GENERATED is the number of transactions.
func TestMeasureGeneratedColumns(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("FKMAT_MEASURE_GENERATED"))
	if n <= 0 {
		t.Skip("set FKMAT_MEASURE_GENERATED to a transaction count to measure")
	}
	for round := range 2 {
		for _, kind := range []string{"generated", "plain"} {
			tc := testenv.New(t)
			col := `length_hours numeric GENERATED ALWAYS AS (length / 60.0) STORED`
			if kind == "plain" {
				col = `length_hours numeric`
			}
			sqlExec(t, tc, `CREATE TABLE studios (id int PRIMARY KEY, name text)`, `INSERT INTO studios VALUES (1, 'a'), (2, 'b')`,
				`CREATE TABLE films (id bigint PRIMARY KEY, studio_id int, length int, `+col+`)`,
				`INSERT INTO films (id, studio_id, length) SELECT g, 1 + g % 2, g FROM generate_series(1, 10000) g`)
			cfg := daemonConfig(t, tc, `
joins:
  - name: films_studios
    type: left
    left: {table: public.films, foreign_key: [studio_id], columns: [id, length, length_hours]}
    right: {table: public.studios, columns: [name]}
    target: {table: public.films_studios}
`)
			runCaughtUp(t, tc, cfg, fkmat.Options{})
			set := `length = length + 1`
			if kind == "plain" {
				set += `, length_hours = (length + 1) / 60.0`
			}
			sqlExec(t, tc, `CREATE PROCEDURE churn(n int) LANGUAGE plpgsql AS $$
				BEGIN FOR i IN 1..n LOOP UPDATE films SET `+set+` WHERE id = 1 + i % 10000; COMMIT; END LOOP; END $$`,
				`CALL churn(`+strconv.Itoa(n)+`)`)
			start := time.Now()
			d := startDaemon(t, cfg, fkmat.Options{})
			waitCaughtUp(t, tc, d)
			took := time.Since(start)
			if err := d.stop(t); err != nil {
				t.Fatal(err)
			}
			assertOracle(t, cfg)
			t.Logf("round %d %-9s: %d transactions caught up in %s (%.0f txn/s)", round, kind, n, took.Round(time.Millisecond), float64(n)/took.Seconds())
		}
	}
}
