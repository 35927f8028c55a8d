#!/usr/bin/env bash
# Run every Go fuzz target in the repository for SECONDS each (default 30).
#
#   scripts/fuzz.sh [SECONDS]        (make fuzz FUZZTIME=SECONDS)
#
# Targets are found by grepping *_test.go files for `func FuzzName(`; each
# runs alone with `go test -run '^$' -fuzz '^FuzzName$' -fuzztime Ns`. A
# crash makes go test write the failing input under the package's
# testdata/fuzz/FuzzName/ (it then becomes part of the seed corpus that
# `make test` replays); this script carries on with the other targets and
# exits 1 at the end, listing every target that failed.
set -uo pipefail
cd "$(dirname "$0")/.."

secs=${1:-30}
if ! [[ $secs =~ ^[1-9][0-9]*$ ]]; then
	echo "usage: $0 [SECONDS]   (a whole number of seconds per target, default 30)" >&2
	exit 2
fi
GO=${GO:-go}

# "file func" pairs, sorted; .git and vendor are skipped.
mapfile -t targets < <(grep -rEo --include='*_test.go' --exclude-dir=.git --exclude-dir=vendor \
	'^func Fuzz[A-Za-z0-9_]*\(' . | sed -E 's/^\.\/(.*):func (Fuzz[A-Za-z0-9_]*)\($/\1 \2/' | sort)
if [ ${#targets[@]} -eq 0 ]; then
	echo "fuzz: no fuzz targets found" >&2
	exit 1
fi

echo "fuzz: ${#targets[@]} targets, ${secs}s each"
failed=()
raced=()
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for t in "${targets[@]}"; do
	file=${t% *}
	name=${t#* }
	pkg=./$(dirname "$file")
	corpus=$pkg/testdata/fuzz/$name
	before=$(ls "$corpus" 2>/dev/null)
	echo "=== $name ($pkg)"
	if $GO test -run '^$' -fuzz "^${name}\$" -fuzztime "${secs}s" "$pkg" 2>&1 | tee "$out"; then
		continue
	fi
	# Go 1.26's fuzz coordinator can fail a run with a bare "context
	# deadline exceeded" when -fuzztime ends while a starved worker is
	# mid-input (go.dev/issue/75804, fixed in Go 1.27): no input is
	# written, so there is nothing to replay. A real finding always
	# writes its input under testdata/fuzz/.
	if [ "$(ls "$corpus" 2>/dev/null)" = "$before" ] && grep -q '^    context deadline exceeded$' "$out" &&
		! grep -q 'Failing input written to' "$out"; then
		raced+=("$name ($pkg)")
		echo "fuzz: $name ended on Go's fuzztime deadline race (go.dev/issue/75804); no input was written, nothing found" >&2
		continue
	fi
	failed+=("$name ($pkg)")
	echo "!!! $name FAILED: the crashing input is under $corpus/" >&2
done
if [ ${#raced[@]} -gt 0 ]; then
	echo "fuzz: ${#raced[@]} target(s) ended on the fuzztime deadline race without an input: ${raced[*]}" >&2
fi

if [ ${#failed[@]} -gt 0 ]; then
	echo >&2
	echo "fuzz: ${#failed[@]} of ${#targets[@]} targets FAILED:" >&2
	printf '  %s\n' "${failed[@]}" >&2
	exit 1
fi
echo "fuzz: all ${#targets[@]} targets ran ${secs}s without a failure"
