#!/usr/bin/env bash
# Makes a Docker engine answer on this machine: installs the packages fkmat's
# tests need when they are missing (Docker, debootstrap, redis-server, and
# promtool and systemd-analyze for the deployment files, pgbench, Compose,
# a static busybox) (as root, with apt-get), then starts dockerd
# in the background when no engine answers. Idempotent; prints what it does.
set -euo pipefail

# Several test packages may start at once: one of them prepares, the others wait.
exec 9>"${TMPDIR:-/tmp}/fkmat-docker.lock"
flock 9

need_pkgs=()
command -v dockerd >/dev/null 2>&1 || need_pkgs+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need_pkgs+=(debootstrap)
{ command -v redis-server && command -v redis-cli; } >/dev/null 2>&1 || need_pkgs+=(redis-server redis-tools)
# promtool checks deploy/prometheus/alerts.yaml; systemd-analyze the unit.
command -v promtool >/dev/null 2>&1 || need_pkgs+=(prometheus)
command -v systemd-analyze >/dev/null 2>&1 || need_pkgs+=(systemd)
# The README's quick start (TestReadmeQuickStart) runs Compose: the plugin,
# or Debian's docker-compose.
docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1 || need_pkgs+=(docker-compose)
# The Dockerfile's test builds it on a Go image made of this machine's Go
# and a static busybox (scripts/go-image.sh).
dpkg -s busybox-static >/dev/null 2>&1 || need_pkgs+=(busybox-static)
# pgbench drives the pgbench bench workload and TestContinuousVerifyPgbench.
[ -x /usr/lib/postgresql/15/bin/pgbench ] || need_pkgs+=(postgresql-client-15)
if ((${#need_pkgs[@]})); then
	if [ "$(id -u)" -ne 0 ]; then
		echo "fkmat: missing packages: ${need_pkgs[*]}; install them (apt-get install -y ${need_pkgs[*]}) or run as root" >&2
		exit 1
	fi
	echo "fkmat: installing ${need_pkgs[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q >/dev/null
	apt-get install -y -q --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

if docker info >/dev/null 2>&1; then
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "fkmat: no Docker engine answers; start dockerd (or set DOCKER_HOST)" >&2
	exit 1
fi
log=${FKMAT_DOCKERD_LOG:-/var/log/fkmat-dockerd.log}
echo "fkmat: starting dockerd (log: $log)"
# setsid: dockerd must outlive the make/test process that started it.
setsid dockerd >"$log" 2>&1 </dev/null 9>&- &
for _ in $(seq 1 60); do
	if docker info >/dev/null 2>&1; then
		exit 0
	fi
	sleep 1
done
echo "fkmat: dockerd did not answer within 60 s; see $log" >&2
tail -20 "$log" >&2 || true
exit 1
