# participantd in a container: a static binary on a distroless base, run as
# a non-root user, data in the /data volume.
#
#   docker build -t participantd .
#   docker run --rm participantd --generate-token > auth-token   # keep it 0600
#   docker run -d -p 7420:7420 -p 127.0.0.1:7421:7421 -v participantd-data:/data \
#     -v "$PWD/auth-token:/run/secrets/auth-token:ro" \
#     -e PARTICIPANTD_AUTH_TOKEN_FILE=/run/secrets/auth-token participantd
#
# The image listens on 0.0.0.0, so it refuses to start with no auth token,
# no client certificates (--tls-client-ca) and the open enroll policy:
# anyone who found the port could read every conversation. Give a token
# (weak and placeholder ones are refused too), or --enroll-policy invite,
# or say PARTICIPANTD_ALLOW_OPEN_ADMISSION=true to mean it. The health
# port serves the health check and /metrics; its admin endpoints answer
# inside the container only (docker exec ... participantctl backup).
#
# Settings are PARTICIPANTD_* environment variables (docker run -e ...;
# `participantd --help` lists them). `docker stop` sends SIGTERM, which
# drains (default within 10 s; docker's default grace is 10 s too, so give
# it --stop-timeout 30 with a longer --drain-timeout).
#
# .ci/run executes this build stage's RUN lines (OUT set to a temporary
# directory) to check that they build: keep them self-contained shell.
#
# participantbench is not in the image: it loads a server from outside,
# and its --etcd-compare would add an etcd server to the image.

FROM golang:1.26.8 AS build
ARG OUT=/out
# The commit, stamped into --version as make release does (the version
# itself is internal/buildinfo/VERSION, built in):
#   docker build --build-arg REVISION=$(git rev-parse HEAD) -t participantd:$(cat internal/buildinfo/VERSION) .
ARG REVISION=unknown
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN ldflags="-s -w -X github.com/participantd/participantd/internal/buildinfo.revision=${REVISION:-unknown}" && \
    CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags="$ldflags" -o "$OUT/participantd" ./cmd/participantd && \
    CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags="$ldflags" -o "$OUT/participantctl" ./cmd/participantctl && \
    "$OUT/participantd" --version && \
    mkdir -p "$OUT/data"

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/participantd /out/participantctl /usr/local/bin/
# The volume's mount point, owned by the non-root user so that a fresh
# named volume is writable.
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
ENV PARTICIPANTD_DATA=/data \
    PARTICIPANTD_LISTEN=0.0.0.0:7420 \
    PARTICIPANTD_HEALTH_LISTEN=0.0.0.0:7421
VOLUME ["/data"]
EXPOSE 7420 7421
STOPSIGNAL SIGTERM
# The image has no HTTP client: participantd probes its own /ready.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/usr/local/bin/participantd", "--healthcheck"]
ENTRYPOINT ["/usr/local/bin/participantd"]
