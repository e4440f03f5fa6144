#!/usr/bin/env bash
# Builds a Go image for the Dockerfile's test without a registry: this
# machine's Go toolchain and a static busybox (the shell the Dockerfile's RUN
# needs), imported with `docker import`. Prints the image's name.
#   scripts/go-image.sh   ->  fkmat-test/go:<go version>
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
"$here/ensure-docker.sh" >&2

goroot=$(go env GOROOT)
image=fkmat-test/go:$(go env GOVERSION)
if docker image inspect "$image" >/dev/null 2>&1; then
	echo "$image"
	exit 0
fi
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
mkdir -p "$rootfs/bin" "$rootfs/etc/ssl/certs" "$rootfs/tmp" "$rootfs/root" "$rootfs/usr/local"
cp /bin/busybox "$rootfs/bin/"
for c in sh mkdir chmod cp echo cat ls rm; do ln -s busybox "$rootfs/bin/$c"; done
cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"
chmod 1777 "$rootfs/tmp"
tar -c -C "$rootfs" . -C "$(dirname "$goroot")" --exclude="$(basename "$goroot")/test" --exclude="$(basename "$goroot")/doc" \
	--transform "s|^$(basename "$goroot")|usr/local/go|" "$(basename "$goroot")" |
	docker import --change 'ENV PATH=/usr/local/go/bin:/bin' --change 'ENV HOME=/root' --change 'ENV GOPATH=/root/go' \
		- "$image" >/dev/null
echo "$image"
