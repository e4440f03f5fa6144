#!/usr/bin/env bash
# Builds fkmat's local test images when they are missing:
#   fkmat-test/postgres:15  and  fkmat-test/redis:7
# from one minimal Debian rootfs (debootstrap, postgresql-15 + redis-server),
# imported with `docker import`. No image registry is needed. The Debian mirror
# is read from this machine's own apt sources (or FKMAT_DEBIAN_MIRROR).
set -euo pipefail

# Several test packages may start at once: one of them prepares, the others wait.
exec 9>"${TMPDIR:-/tmp}/fkmat-images.lock"
flock 9

here=$(cd "$(dirname "$0")" && pwd)
pg_image=${FKMAT_TEST_POSTGRES_IMAGE:-fkmat-test/postgres:15}
redis_image=${FKMAT_TEST_REDIS_IMAGE:-fkmat-test/redis:7}
local_pg=fkmat-test/postgres:15
local_redis=fkmat-test/redis:7

"$here/ensure-docker.sh"

# An image built from other entrypoints than scripts/testimages/ holds is
# built again: the label carries their hash.
entrypoints=$(cat "$here"/testimages/*.sh | sha256sum | cut -c1-16)
have() {
	[ "$(docker image inspect -f '{{index .Config.Labels "fkmat.entrypoints"}}' "$1" 2>/dev/null)" = "$entrypoints" ]
}

# Images chosen by the user (official ones, say) are theirs to provide.
want=()
[ "$pg_image" = "$local_pg" ] && ! have "$local_pg" && want+=(pg)
[ "$redis_image" = "$local_redis" ] && ! have "$local_redis" && want+=(redis)
if ((${#want[@]} == 0)); then
	echo "fkmat: test images present"
	exit 0
fi

mirror_from_apt() {
	local f
	shopt -s nullglob
	# deb822 files: a URIs line followed (in the same stanza) by a Suites line naming bookworm.
	for f in /etc/apt/sources.list.d/*.sources; do
		awk '/^URIs:/ {u=$2} /^Suites:/ {for (i=2; i<=NF; i++) if ($i=="bookworm") {print u; exit}}' "$f"
	done
	# one-line format: deb [opts] URI bookworm components
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -r "$f" ] || continue
		awk '$1=="deb" {for (i=2; i<=NF; i++) if ($i ~ /^[a-z]+:\/\//) {if ($(i+1)=="bookworm") print $i; break}}' "$f"
	done
}
mirror=${FKMAT_DEBIAN_MIRROR:-$(mirror_from_apt | sed -n 1p)}
if [ -z "$mirror" ]; then
	echo "fkmat: no Debian bookworm mirror in /etc/apt/sources*; set FKMAT_DEBIAN_MIRROR" >&2
	exit 1
fi

rootfs=$(mktemp -d /tmp/fkmat-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
echo "fkmat: building test images with debootstrap (mirror from apt sources)"
start=$(date +%s)
debootstrap --variant=minbase --include=postgresql-15,redis-server bookworm "$rootfs" "$mirror" \
	>"$rootfs.log" 2>&1 || { tail -30 "$rootfs.log" >&2; exit 1; }
rm -f "$rootfs.log"
# The package's own cluster is not used: the entrypoint runs initdb like the official image.
rm -rf "$rootfs"/var/lib/postgresql/15/main "$rootfs"/etc/postgresql/15/main
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
install -m 0755 "$here/testimages/postgres-entrypoint.sh" "$rootfs/usr/local/bin/postgres-entrypoint.sh"
install -m 0755 "$here/testimages/redis-entrypoint.sh" "$rootfs/usr/local/bin/redis-entrypoint.sh"

for w in "${want[@]}"; do
	case $w in
	pg)
		tar -C "$rootfs" -c . | docker import \
			-c 'ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
			-c 'ENV PGDATA=/var/lib/postgresql/data' \
			-c 'ENTRYPOINT ["/usr/local/bin/postgres-entrypoint.sh"]' \
			-c 'CMD ["postgres"]' -c 'EXPOSE 5432' -c "LABEL fkmat.entrypoints=$entrypoints" \
			- "$local_pg" >/dev/null
		;;
	redis)
		tar -C "$rootfs" -c . | docker import \
			-c 'ENTRYPOINT ["/usr/local/bin/redis-entrypoint.sh"]' \
			-c 'CMD ["redis-server"]' -c 'EXPOSE 6379' -c 'WORKDIR /data' -c "LABEL fkmat.entrypoints=$entrypoints" \
			- "$local_redis" >/dev/null
		;;
	esac
done
echo "fkmat: test images built in $(($(date +%s) - start)) s"
