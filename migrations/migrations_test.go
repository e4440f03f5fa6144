package migrations_test

import (
	"context"
	"database/sql"
	"os"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/migrations"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// TestUpIdempotentAndConcurrent applies the migrations from three processes'
// worth of connections at once, then again, and checks the schema.
func TestUpIdempotentAndConcurrent(t *testing.T) {
	tc := testenv.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := sql.Open("pgx", tc.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- migrations.Up(ctx, db)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent Up: %v", err)
		}
	}
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatalf("second Up: %v", err)
	}
	got, err := migrations.Version(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	want, err := migrations.Latest()
	if err != nil {
		t.Fatal(err)
	}
	if got != want || want < 1 {
		t.Fatalf("version = %d, want %d", got, want)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.tables
		WHERE table_schema = 'fkmat' AND table_name IN ('checkpoint', 'join_state')`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("metadata tables: %d, %v", n, err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO fkmat.checkpoint (slot, lsn) VALUES ('s', '0/16B3748')`); err != nil {
		t.Fatalf("checkpoint row: %v", err)
	}
}
