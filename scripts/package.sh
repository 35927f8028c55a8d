#!/usr/bin/env bash
# Build the heft-agent and heft-coordinator .deb and .rpm packages with nfpm
# (pinned in tools/go.mod). Output: $DIST (default dist/). Builds for the
# host's architecture: the agent links NVML through cgo.
set -euo pipefail
cd "$(dirname "$0")/.."
export DIST=${DIST:-dist}
export GOARCH=${GOARCH:-$(go env GOARCH)}
export VERSION=${VERSION:-$(git describe --tags --always 2>/dev/null | sed 's/^v//; s/-/./g' || echo 0.0.0)}
# deb and rpm versions must start with a digit.
case "$VERSION" in [0-9]*) ;; *) VERSION="0.0.0+$VERSION" ;; esac
export CGO_CFLAGS=${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}
mkdir -p "$DIST/linux_$GOARCH"
ldflags="-s -w -X heft/shared/version.Version=$VERSION"
go build -trimpath -ldflags "$ldflags" -o "$DIST/linux_$GOARCH/" ./agent/cmd/heft-agent ./coordinator/cmd/heft-coordinator
for pkg in agent coordinator; do
	for fmt in deb rpm; do
		go tool -modfile=tools/go.mod nfpm pkg --config "packaging/nfpm/$pkg.yaml" --packager "$fmt" --target "$DIST/" >/dev/null
	done
done
ls -1 "$DIST"/*.deb "$DIST"/*.rpm
