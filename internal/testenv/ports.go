package testenv

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Test servers listen on loopback ports the harness picks. make test runs
// two test processes side by side, and their servers restart on the same
// port (a Redis or Postgres restart, a killed cluster node): a port that is
// free for a moment is not free to take. So a port is reserved for the life
// of the process that picked it, by an exclusive flock on a file named after
// it; the other process skips it. Ports are picked outside the kernel's
// ephemeral range where it leaves room, so that no outgoing connection takes
// a server's port while the server is down.

var (
	portMu    sync.Mutex
	portHeld  []*os.File // the open lock files: closing one would release its port
	portRange = sync.OnceValues(pickRange)
)

const portLockDir = "fkmat-test-ports"

// ReservePort returns a loopback port that is free now and that no other
// fkmat test process holds or will take while this one runs.
func ReservePort() (int, error) {
	lo, hi := portRange()
	dir := filepath.Join(os.TempDir(), portLockDir)
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return 0, fmt.Errorf("port reservations: %w", err)
	}
	portMu.Lock()
	defer portMu.Unlock()
	n := hi - lo + 1
	start := rand.IntN(n)
	for i := range n {
		p := lo + (start+i)%n
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(p)), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			return 0, fmt.Errorf("port reservations: %w", err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			_ = f.Close()
			continue
		}
		if !free(p) {
			_ = f.Close() // releases the lock
			continue
		}
		portHeld = append(portHeld, f)
		return p, nil
	}
	return 0, errors.New("no free loopback port to reserve")
}

// pickRange returns the ports ReservePort picks from: the largest stretch
// of 10000-65535 outside the ephemeral range, or all of it if that leaves
// fewer than 2000.
func pickRange() (int, int) {
	lo, hi := 10000, 65535
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return lo, hi
	}
	elo, err1 := strconv.Atoi(f[0])
	ehi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return lo, hi
	}
	below, above := elo-lo, hi-ehi
	switch {
	case below >= above && below >= 2000:
		return lo, elo - 1
	case above >= 2000:
		return ehi + 1, hi
	}
	return lo, hi
}

func free(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}
