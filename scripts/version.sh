#!/bin/sh
# Print heft's version, read from the VERSION file at the repository root.
#
#   scripts/version.sh            the binaries' version: 0.2.0+<commit>, with
#                                 -dirty when tracked files differ from HEAD
#                                 (semver build metadata)
#   scripts/version.sh --package  the deb/rpm version: 0.2.0; a semver
#                                 pre-release 0.3.0-rc.1 becomes 0.3.0~rc.1,
#                                 which dpkg and rpm order before 0.3.0
#
# VERSION in the environment replaces the file (the packaging tests use it).
set -eu
cd "$(dirname "$0")/.."
v=${VERSION:-$(cat VERSION)}
if ! printf '%s\n' "$v" | grep -Eq '^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$'; then
	echo "version.sh: version '$v' is not MAJOR.MINOR.PATCH[-PRERELEASE]" >&2; exit 1
fi
case "${1:-}" in
	--package) printf '%s\n' "$v" | sed 's/-/~/' ;;
	"")
		commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
		dirty=
		if [ "$commit" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then dirty=-dirty; fi
		printf '%s+%s%s\n' "$v" "$commit" "$dirty" ;;
	*) echo "usage: scripts/version.sh [--package]" >&2; exit 2 ;;
esac
