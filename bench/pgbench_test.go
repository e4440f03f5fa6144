package bench

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// pgbenchYAML is the pgbench case: every TPC-B transaction
// updates one branch, whose change fans out to the branch's accounts
// (100,000 per scale unit) and tellers.
const pgbenchYAML = `
joins:
  - name: accounts_branches
    type: left
    left: {table: pgbench_accounts, foreign_key: [bid], columns: [aid, bid, abalance]}
    right: {table: pgbench_branches, columns: [bbalance]}
    target: {table: accounts_branches}
  - name: tellers_branches
    type: inner
    left: {table: pgbench_tellers, foreign_key: [bid], columns: [tid, bid, tbalance]}
    right: {table: pgbench_branches, columns: [bbalance]}
    target: {table: tellers_branches}
`

// pgbenchBin finds pgbench (Debian: postgresql-client-15).
func pgbenchBin(t *testing.T) string {
	if p, err := exec.LookPath("pgbench"); err == nil {
		return p
	}
	p := "/usr/lib/postgresql/15/bin/pgbench"
	if _, err := os.Stat(p); err != nil {
		t.Fatal("pgbench not installed (Debian: postgresql-client-15)")
	}
	return p
}

// pgbench runs pgbench with args against d's database and returns its TPS
// (without the initial connection time) and when it ended.
func (d *db) pgbench(args ...string) (float64, time.Time) {
	d.b.Helper()
	out, err := exec.Command(pgbenchBin(d.b.(*testing.T)), append(args, d.DatabaseURL)...).CombinedOutput()
	end := time.Now()
	if err != nil {
		d.b.Fatalf("pgbench %v: %v\n%s", args, err, out)
	}
	m := regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`).FindSubmatch(out)
	if m == nil {
		return 0, end // -i prints no tps
	}
	tps, _ := strconv.ParseFloat(string(m[1]), 64)
	return tps, end
}

// benchW5 (pgbench): TPC-B (`pgbench -c 4 -j 2 -T s`) on a database
// initialized with `pgbench -i -s scale`, without fkmat and with `fkmat run`
// live on the two joins of pgbenchYAML, each on a fresh database; the
// backlog is the time from pgbench's end until fkmat caught up; both
// targets end equal to their SQL joins.
func benchW5(t *testing.T, s sizes, rep *report) {
	w := &workload{name: "W5", title: "pgbench TPC-B", yaml: pgbenchYAML}
	name := w.name + " " + w.title
	run := []string{"-n", "-c", "4", "-j", "2", "-T", strconv.Itoa(s.W5Seconds)}
	initArgs := []string{"-i", "-q", "-s", strconv.Itoa(s.W5Scale)}
	var base float64
	{
		d := newDB(t, w)
		d.pgbench(initArgs...)
		base, _ = d.pgbench(run...)
	}
	d := newDB(t, w)
	d.pgbench(initArgs...)
	bf := d.backfill()
	p := d.run("pgbench")
	d.waitCaught(p)
	tps, end := d.pgbench(run...)
	backlog := d.waitCaught(p).Sub(end)
	u := p.stop()
	d.assertQuery("accounts_branches", `SELECT aid, bid, abalance, bbalance FROM accounts_branches`,
		`SELECT a.aid, a.bid, a.abalance, b.bbalance FROM pgbench_accounts a LEFT JOIN pgbench_branches b ON a.bid = b.bid`)
	d.assertQuery("tellers_branches", `SELECT tid, bid, tbalance, bbalance FROM tellers_branches`,
		`SELECT t.tid, t.bid, t.tbalance, b.bbalance FROM pgbench_tellers t JOIN pgbench_branches b ON t.bid = b.bid`)
	if out, err := d.command("verify").CombinedOutput(); err != nil {
		t.Fatalf("fkmat verify: %v\n%s", err, out)
	}
	rep.row(name, "TPS without fkmat", base, "tps", fmt.Sprintf("pgbench -s %d, -c 4 -j 2 -T %d", s.W5Scale, s.W5Seconds), false)
	rep.row(name, "TPS with fkmat running", tps, "tps", fmt.Sprintf("%.2fx the TPS without", tps/base), false)
	rep.row(name, "backlog when pgbench stops", backlog.Seconds(), "s", "pgbench's end to fkmat caught up; fkmat verify: equal", false)
	rep.row(name, "fkmat target rows written", u.upserted+u.deleted, "rows",
		fmt.Sprintf("fan-out rows %.0f; CPU fkmat %.1f s, redis-server %.1f s, walsender %.1f s, target backends %.1f s",
			u.fanoutRows, u.cpu, u.redisCPU, u.walsenderCPU, u.backendCPU), false)
	rep.row(name, "fkmat peak RSS", max(u.peakRSSMB, bf.peakRSSMB), "MB", "backfill and run", false)
	rep.rss = max(rep.rss, u.peakRSSMB, bf.peakRSSMB)
	rep.target("pgbench TPS with fkmat live ≥ 0.6x without", tps/base, ">=", 0.6, "x")
	rep.target("pgbench backlog when pgbench stops ≤ 3 s", backlog.Seconds(), "<=", 3, "s")
}
