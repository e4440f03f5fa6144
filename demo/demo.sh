#!/usr/bin/env bash
# make demo: throwaway Postgres + Redis containers (the local test images), sample
# customers/orders, the real fkmat daemon, a short live workload, fkmat verify,
# and cleanup. Everything listens on 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/test-images.sh
make -s build

pg=fkmat-demo-pg-$$
rd=fkmat-demo-redis-$$
pgport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
rdport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
daemon_pid=
cleanup() {
	[ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null || true
	docker rm -f "$pg" "$rd" >/dev/null 2>&1 || true
}
trap cleanup EXIT

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
sql() { docker exec -i "$pg" psql -X -q -v ON_ERROR_STOP=1 -U postgres -d shop "$@"; }
# caught_up waits until the slot's confirmed_flush_lsn covers every commit so
# far: fkmat acknowledges only what is committed in the target.
caught_up() {
	local lsn
	lsn=$(sql -At -c "SELECT pg_current_wal_lsn()")
	for _ in $(seq 1 120); do
		[ "$(sql -At -c "SELECT confirmed_flush_lsn >= '$lsn' FROM pg_replication_slots WHERE slot_name = 'fkmat_demo'")" = t ] && return
		sleep 0.25
	done
	echo "not caught up after 30 s; see demo-run.log" >&2
	exit 1
}
show() {
	caught_up
	sql -c "SELECT * FROM orders_enriched WHERE id IN (1, 2, 3, 4, 20001) ORDER BY id"
}

say "starting Postgres 15 (wal_level=logical) and Redis 7 on 127.0.0.1"
docker run -d --name "$pg" -e POSTGRES_PASSWORD=demo -e POSTGRES_DB=shop \
	-p "127.0.0.1:$pgport:5432" fkmat-test/postgres:15 -c wal_level=logical >/dev/null
docker run -d --name "$rd" -p "127.0.0.1:$rdport:6379" fkmat-test/redis:7 >/dev/null
for _ in $(seq 1 60); do
	sql -c 'SELECT 1' >/dev/null 2>&1 && break
	sleep 0.5
done

say "sample data (demo/sample.sql): 3 regions, 1,000 customers, 20,000 orders"
sql <demo/sample.sql

export FKMAT_CONFIG=demo/fkmat.yaml
export FKMAT_SOURCE_URL="postgres://postgres:demo@127.0.0.1:$pgport/shop?sslmode=disable"
export FKMAT_REDIS_URL="redis://127.0.0.1:$rdport/0"

say "fkmat check"
bin/fkmat check

say "fkmat run (backfills, then streams; logs in demo-run.log)"
bin/fkmat run --log-level info >demo-run.log 2>&1 &
daemon_pid=$!
for _ in $(seq 1 120); do
	phase=$(bin/fkmat status --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["joins"][0]["phase"])' 2>/dev/null || true)
	[ "$phase" = streaming ] && break
	sleep 0.5
done
show

say "region 3 renamed: every order of every customer in it follows (a fan-out through the chain)"
sql -c "UPDATE regions SET name = 'Asia-Pacific' WHERE id = 3"
show

say "customer 2 renamed: every order of customer 2 follows (fan-out)"
sql -c "UPDATE customers SET name = 'Ada Lovelace', tier = 'platinum' WHERE id = 2"
show

say "order 3 moves to customer 2; order 4 loses its customer (NULL); new order 20001"
sql -c "BEGIN; UPDATE orders SET customer_id = 2 WHERE id = 3; UPDATE orders SET customer_id = NULL WHERE id = 4;
        INSERT INTO orders VALUES (20001, 2, 99.90, 'new'); COMMIT"
show

say "customer 2 deleted (left join keeps its orders with NULL customer columns); order 1 deleted"
sql -c "BEGIN; DELETE FROM customers WHERE id = 2; DELETE FROM orders WHERE id = 1; COMMIT"
show

say "a burst: 5,000 amount updates and 200 customer renames"
sql -c "UPDATE orders SET amount = amount + 1 WHERE id % 4 = 0; UPDATE customers SET name = upper(name) WHERE id <= 200"
caught_up

say "fkmat status"
bin/fkmat status

say "fkmat verify (target vs the SQL join)"
bin/fkmat verify

say "stopping the daemon (SIGTERM: flush, checkpoint, exit 0)"
kill -TERM "$daemon_pid"
wait "$daemon_pid"
daemon_pid=
echo "daemon exited cleanly"
