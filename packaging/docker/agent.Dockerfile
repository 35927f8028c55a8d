# heft-agent image. Build from the repository root:
#   docker build -f packaging/docker/agent.Dockerfile --build-arg VERSION=$(scripts/version.sh) -t heft-agent .
# NVML (libnvidia-ml.so) is not in the image: the NVIDIA container runtime
# mounts the host driver's libraries at run time (NVIDIA_DRIVER_CAPABILITIES
# must include "utility"), and the agent loads it without cgo, as in the
# packages: dynamic, naming no glibc version, so any glibc base image works.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -buildmode=pie \
    -ldflags "-s -w -bindnow -X heft/shared/version.Version=${VERSION}" \
    -o /out/heft-agent ./agent/cmd/heft-agent

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/heft-agent /usr/bin/heft-agent
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
ENTRYPOINT ["/usr/bin/heft-agent"]
CMD ["run", "--config", "/etc/heft/agent.toml"]
