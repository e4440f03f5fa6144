#!/usr/bin/env bash
# Builds a release of fkmat into dist/: for linux/amd64 and linux/arm64 a
# static binary in an archive with the man page, the shell completions, the
# LICENSE, the README, the CHANGELOG and deploy/; the container image as a
# tarball (docker load -i); and SHA256SUMS over them.
#   scripts/release.sh vX.Y.Z    (make release VERSION=vX.Y.Z)
# The version must be a tag of the checked-out commit, the tree clean: a
# release is what its tag names. FKMAT_RELEASE_UNTAGGED=1 lifts that, for
# tests. FKMAT_RELEASE_NO_IMAGE=1 leaves the image out.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
version=${1:-${VERSION:-}}
if [[ ! "$version" =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
	echo "release: give the version as vX.Y.Z, e.g. make release VERSION=v0.2.0 (got \"$version\")" >&2
	exit 2
fi
if [ "${FKMAT_RELEASE_UNTAGGED:-}" != 1 ]; then
	if [ "$(git -C "$root" describe --tags --exact-match 2>/dev/null || true)" != "$version" ]; then
		echo "release: $version is not a tag of the checked-out commit; tag it first: git tag -a $version -m 'fkmat $version'" >&2
		exit 2
	fi
	if [ -n "$(git -C "$root" status --porcelain)" ]; then
		echo "release: the tree has uncommitted changes; a release is built from its tag alone" >&2
		exit 2
	fi
fi

dist=${DIST:-$root/dist}
rm -rf "$dist"
mkdir -p "$dist"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ldflags="-s -w -X github.com/fkmat/fkmat/internal/buildinfo.version=$version"

# The man page and the completions come from a binary that runs here
# (they are the same for every architecture).
host="$work/host-fkmat"
(cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$host" ./cmd/fkmat)
for arch in amd64 arm64; do
	name="fkmat-$version-linux-$arch"
	stage="$work/$name"
	mkdir -p "$stage/man/man1" "$stage/completions"
	(cd "$root" && CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -ldflags "$ldflags" -o "$stage/fkmat" ./cmd/fkmat)
	cp "$root/LICENSE" "$root/README.md" "$root/CHANGELOG.md" "$stage/"
	cp -r "$root/deploy" "$stage/deploy"
	"$host" man >"$stage/man/man1/fkmat.1"
	"$host" completion bash >"$stage/completions/fkmat.bash"
	"$host" completion zsh >"$stage/completions/_fkmat"
	"$host" completion fish >"$stage/completions/fkmat.fish"
	tar -C "$work" --owner=0 --group=0 -czf "$dist/$name.tar.gz" "$name"
done

if [ "${FKMAT_RELEASE_NO_IMAGE:-}" != 1 ]; then
	VERSION=$version "$here/image.sh" fkmat >/dev/null
	docker save "fkmat:$version" | gzip >"$dist/fkmat-$version-image.tar.gz"
fi

(cd "$dist" && sha256sum -- *.tar.gz >SHA256SUMS)
echo "release: $version in $dist:"
(cd "$dist" && ls -l)
