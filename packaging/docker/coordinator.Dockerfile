# heft-coordinator image. Build from the repository root:
#   docker build -f packaging/docker/coordinator.Dockerfile --build-arg VERSION=$(scripts/version.sh) -t heft-coordinator .
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X heft/shared/version.Version=${VERSION}" \
    -o /out/heft-coordinator ./coordinator/cmd/heft-coordinator

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/heft-coordinator /usr/bin/heft-coordinator
EXPOSE 7070
VOLUME ["/var/lib/heft"]
ENTRYPOINT ["/usr/bin/heft-coordinator"]
# state_dir defaults to /var/lib/heft, the volume; no --state-dir, which would
# beat the mounted config's state_dir.
CMD ["--config", "/etc/heft/coordinator.toml"]
