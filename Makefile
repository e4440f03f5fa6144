# fkmat — see README.md. `make test` sets up everything it needs on a fresh
# Debian machine (as root): packages, dockerd, the local test images.
GO      ?= go
BIN     := bin/fkmat
GOBIN   := $(CURDIR)/.bin
STATICCHECK_VERSION := v0.8.2
# make test takes about 10 minutes here (scripts/test.sh: two streams side
# by side, each 8 to 10 minutes); the timeout leaves room for this
# machine's slow days (2-3x), so that they fail no CI run by themselves.
TEST_TIMEOUT ?= 45m
# The version embedded in builds: the nearest tag (or the commit), with
# -dirty for uncommitted changes.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/fkmat/fkmat/internal/buildinfo.version=$(VERSION)

export PATH := $(PATH):/usr/local/go/bin

.PHONY: build help image release demo bench test test-unit test-race test-images lint soak

## build: the fkmat binary in bin/ (the default target)
build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/fkmat

## help: this list of targets
help:
	@grep -E '^## [a-z-]+:' $(firstword $(MAKEFILE_LIST)) | sed 's/^## //' | \
		awk '{ i = index($$0, ": "); printf "  %-12s %s\n", substr($$0, 1, i - 1), substr($$0, i + 2) }'

## image: the container image fkmat:<version> (and fkmat:latest), from the static binary alone, with no registry
image:
	VERSION=$(VERSION) bash scripts/image.sh fkmat

## release: dist/ for VERSION=vX.Y.Z (a tag of this commit): linux amd64 and arm64 archives (binary, man page, completions), the image tarball, SHA256SUMS
release:
	bash scripts/release.sh $(VERSION)

## demo: throwaway Postgres + Redis, sample data, the real daemon, a live workload, verify, cleanup
demo:
	bash demo/demo.sh

## bench: every workload against every contender in one run; table, JSON and SVG in bench/results/ (make test runs a tiny smoke version)
bench: test-images
	FKMAT_BENCH=full $(GO) test -count=1 -v -run '^TestBench$$' -timeout 90m ./bench/

## test: unit and integration tests, the whole suite (starts Docker, builds test images when missing)
test: test-images
	GO=$(GO) TEST_TIMEOUT=$(TEST_TIMEOUT) bash scripts/test.sh

## soak: the fault-injection tests, long (FKMAT_FAULT_OPS, default 100000 ops; FKMAT_FAULT_SEED replays a run), and 5 minutes of pgbench under continuous verification
soak: test-images
	FKMAT_FAULT_OPS=$${FKMAT_FAULT_OPS:-100000} FKMAT_VERIFY_PGBENCH=$${FKMAT_VERIFY_PGBENCH:-5m} \
		$(GO) test -count=1 -v -run '^(TestFault|TestContinuousVerifyPgbench$$)' -timeout 60m ./integration/

## test-race: the engine's and the pipeline's tests under the race detector, and the integration tests that call testenv.Race (those that drive the daemon in process)
test-race: test-images
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./join/... ./internal/pipeline/ .
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./integration/

## test-unit: tests that need no Docker (integration tests skip under -short)
test-unit:
	$(GO) test -short -count=1 ./...

## test-images: build fkmat-test/postgres:15 and fkmat-test/redis:7 locally when missing
test-images:
	bash scripts/test-images.sh

## lint: gofmt, go vet and staticcheck
lint: $(GOBIN)/staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GOBIN)/staticcheck ./...

$(GOBIN)/staticcheck:
	GOBIN=$(GOBIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
