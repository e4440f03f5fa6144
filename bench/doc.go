// Package bench holds fkmat's benchmarks (make bench): each figure measured
// side by side with its reference in the same run, on real Postgres and
// Redis from the test images. Nothing here runs in make test except the
// smoke version (-short sizes).
package bench
