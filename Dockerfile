# The fkmat image, built from source: a static binary on an empty base, run
# as an unprivileged user, serving /metrics, /healthz and /readyz on 9187
# (FKMAT_METRICS_ADDR; set it empty to turn them off).
#
#   docker build -t fkmat .                      (or: docker compose -f demo/compose.yaml build)
#   docker build --build-arg VERSION=v0.3.0 -t fkmat:v0.3.0 .
#
# `make image` builds the same image without a registry or a base image
# (scripts/image.sh); `make release` ships it as a tarball.
ARG GO_IMAGE=golang:1.26-bookworm

FROM ${GO_IMAGE} AS build
WORKDIR /src
COPY . .
ARG VERSION=dev
ARG GOPROXY=https://proxy.golang.org,direct
RUN CGO_ENABLED=0 GOPROXY=${GOPROXY} go build -trimpath \
	-ldflags "-s -w -X github.com/fkmat/fkmat/internal/buildinfo.version=${VERSION}" \
	-o /out/usr/local/bin/fkmat ./cmd/fkmat \
	&& mkdir -p /out/etc/ssl/certs /out/tmp && chmod 1777 /out/tmp \
	&& cp /etc/ssl/certs/ca-certificates.crt /out/etc/ssl/certs/ \
	&& echo 'fkmat:x:65532:65532:fkmat:/nonexistent:/usr/sbin/nologin' >/out/etc/passwd \
	&& echo 'fkmat:x:65532:' >/out/etc/group

FROM scratch
COPY --from=build /out/ /
USER 65532:65532
ENV FKMAT_METRICS_ADDR=:9187
EXPOSE 9187
ENTRYPOINT ["/usr/local/bin/fkmat"]
CMD ["run"]
