package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// A reserved port is held against every other opener of its lock file (as
// the other test process of make test would be), and is not handed out twice.
func TestReservePort(t *testing.T) {
	seen := map[int]bool{}
	for range 20 {
		p, err := ReservePort()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("port %d reserved twice", p)
		}
		seen[p] = true
		lo, hi := portRange()
		if p < lo || p > hi {
			t.Fatalf("port %d outside %d-%d", p, lo, hi)
		}
		f, err := os.Open(filepath.Join(os.TempDir(), portLockDir, strconv.Itoa(p)))
		if err != nil {
			t.Fatal(err)
		}
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		_ = f.Close()
		if err == nil {
			t.Fatalf("port %d: another process could lock it", p)
		}
	}
}

func TestPortRangeAvoidsEphemeral(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skip(err)
	}
	var elo, ehi int
	if _, err := fmt.Sscan(string(b), &elo, &ehi); err != nil {
		t.Fatal(err)
	}
	lo, hi := pickRange()
	if (elo-10000 >= 2000 || 65535-ehi >= 2000) && hi >= elo && lo <= ehi {
		t.Fatalf("range %d-%d overlaps the ephemeral range %d-%d", lo, hi, elo, ehi)
	}
}
