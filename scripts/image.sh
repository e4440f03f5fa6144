#!/usr/bin/env bash
# Builds the fkmat container image without a registry or a base image: a
# static binary, the build host's CA certificates and a passwd entry for an
# unprivileged user, imported with `docker import`. The daemon serves
# /metrics, /healthz and /readyz on port 9187 (FKMAT_METRICS_ADDR; set it
# empty to turn them off): a container's port is reachable only where it is
# published.
#   scripts/image.sh [name]   (default fkmat; tags name:<version> and name:latest)
# The version is VERSION from the environment (make image passes git describe).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
name=${1:-fkmat}
version=${VERSION:-$(git -C "$root" describe --tags --always --dirty 2>/dev/null || echo dev)}

"$here/ensure-docker.sh"

rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/ssl/certs" "$rootfs/tmp"
chmod 1777 "$rootfs/tmp"
(cd "$root" && CGO_ENABLED=0 go build -trimpath \
	-ldflags "-s -w -X github.com/fkmat/fkmat/internal/buildinfo.version=$version" \
	-o "$rootfs/usr/local/bin/fkmat" ./cmd/fkmat)
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
	cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"
fi
echo 'fkmat:x:65532:65532:fkmat:/nonexistent:/usr/sbin/nologin' >"$rootfs/etc/passwd"
echo 'fkmat:x:65532:' >"$rootfs/etc/group"

tar -C "$rootfs" --owner=0 --group=0 -c . | docker import \
	--change 'USER 65532:65532' \
	--change 'ENTRYPOINT ["/usr/local/bin/fkmat"]' \
	--change 'CMD ["run"]' \
	--change 'ENV FKMAT_METRICS_ADDR=:9187' \
	--change 'EXPOSE 9187' \
	--change "LABEL org.opencontainers.image.title=fkmat org.opencontainers.image.version=$version" \
	- "$name:$version" >/dev/null
docker tag "$name:$version" "$name:latest"
echo "fkmat: built image $name:$version (and $name:latest), $(du -sh "$rootfs" | cut -f1) uncompressed"
