#!/usr/bin/env bash
# Build the heft .deb and .rpm packages with nfpm (pinned in tools/go.mod)
# into $DIST (default dist/), for $GOARCH (default: this machine's; amd64 and
# arm64 both cross-build, as nothing needs cgo).
#
# Versions: the package version is VERSION's (scripts/version.sh --package)
# with release PKG_RELEASE (default 1): 0.2.0-1. The binaries report
# 0.2.0+<commit>. VERSION in the environment replaces the file.
#
# Every binary is built with CGO_ENABLED=0. The coordinator must come out
# static; the agent loads NVML through purego, so it is dynamic but names no
# glibc symbol version: its glibc floor is measured here and declared in the
# packages (packaging/elfcheck).
set -euo pipefail
cd "$(dirname "$0")/.."

# package=command; each has packaging/nfpm/<package>.yaml. Those in $static
# must come out static.
binaries=(agent=./agent/cmd/heft-agent coordinator=./coordinator/cmd/heft-coordinator sync=./gateway/cmd/heft-sync)
static=" coordinator sync "

export DIST=${DIST:-dist}
export GOARCH=${GOARCH:-$(go env GOARCH)}
export PKG_VERSION PKG_RELEASE=${PKG_RELEASE:-1} COMMIT AGENT_GLIBC PKG_ARCH=$GOARCH
PKG_VERSION=$(scripts/version.sh --package)
build_version=$(scripts/version.sh)
COMMIT=${build_version#*+}
case "$PKG_RELEASE" in '' | *[!0-9]*) echo "package.sh: PKG_RELEASE must be a number, got '$PKG_RELEASE'" >&2; exit 1 ;; esac

out="$DIST/linux_$GOARCH"
mkdir -p "$out"
# The tools run here: built for this machine, not for $GOARCH.
host=(GOOS="$(go env GOHOSTOS)" GOARCH="$(go env GOHOSTARCH)")
elfcheck=$(mktemp)
trap 'rm -f "$elfcheck"' EXIT
env "${host[@]}" go build -o "$elfcheck" ./packaging/cmd/elfcheck

for b in "${binaries[@]}"; do
	pkg=${b%%=*} cmd=${b#*=}
	ldflags="-s -w -X heft/shared/version.Version=$build_version"
	if [[ $static == *" $pkg "* ]]; then
		CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "$ldflags" -o "$out/heft-$pkg" "$cmd"
		"$elfcheck" --static "$out/heft-$pkg"
	else
		# Dynamic anyway (it dlopens NVML), so position-independent with
		# RELRO and immediate binding, like distribution binaries.
		CGO_ENABLED=0 GOOS=linux go build -trimpath -buildmode=pie -ldflags "$ldflags -bindnow" -o "$out/heft-$pkg" "$cmd"
	fi
done
AGENT_GLIBC=$("$elfcheck" --glibc-floor "$out/heft-agent")
"$elfcheck" "$out"/heft-*

for b in "${binaries[@]}"; do
	pkg=${b%%=*}
	for fmt in deb rpm; do
		env "${host[@]}" go tool -modfile=tools/go.mod nfpm pkg --config "packaging/nfpm/$pkg.yaml" --packager "$fmt" --target "$DIST/" >/dev/null
	done
done
ls -1 "$DIST"/*.deb "$DIST"/*.rpm
