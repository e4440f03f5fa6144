package human

import (
	"testing"
	"time"
)

func TestBytes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		n    int64
		want string
	}{
		{0, "0 B"}, {1, "1 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {1536, "1.5 KiB"},
		{10188, "9.9 KiB"}, {10189, "10 KiB"}, // 9.95 KiB rounds to 10, not 10.0
		{12 << 20, "12 MiB"}, {1023 << 20, "1023 MiB"},
		{1024<<20 - 1, "1.0 GiB"}, // would round to 1024 MiB
		{3 << 30, "3.0 GiB"}, {5 << 40, "5.0 TiB"}, {-2048, "-2.0 KiB"},
		{1<<63 - 1, "8.0 EiB"},
	} {
		if got := Bytes(c.n); got != c.want {
			t.Errorf("Bytes(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}

func TestCount(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		n    int64
		want string
	}{
		{0, "0"}, {999, "999"}, {1000, "1,000"}, {123456, "123,456"}, {1234567, "1,234,567"}, {-1234, "-1,234"},
	} {
		if got := Count(c.n); got != c.want {
			t.Errorf("Count(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}

func TestDuration(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"}, {900 * time.Millisecond, "0s"}, {4 * time.Second, "4s"}, {192 * time.Second, "3m12s"},
		{3*time.Hour + 12*time.Minute + 59*time.Second, "3h12m"}, {51 * time.Hour, "2d3h"}, {-5 * time.Second, "-5s"},
		{12 * time.Minute, "12m"}, {2*time.Hour + 30*time.Second, "2h"}, {48 * time.Hour, "2d"},
	} {
		if got := Duration(c.d); got != c.want {
			t.Errorf("Duration(%s) = %q, want %q", c.d, got, c.want)
		}
	}
}
