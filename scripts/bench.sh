#!/usr/bin/env bash
# make bench: measure what heft claims about itself (see bench/README.md).
# Builds the binaries, runs every benchmark area on loopback, prints one
# table per area and writes them to bench/results/latest.md. About 60
# minutes on 2 cores; Linux (reads /proc). Extra arguments go to heftbench,
# e.g. ./scripts/bench.sh --quick, or ./scripts/bench.sh --areas 1,5.
set -euo pipefail
cd "$(dirname "$0")/.."

# Area 5 holds 10,000 websockets open in the coordinator and as many in the
# swarm: raise the open-file limit as far as the hard limit allows.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt 12000 ]; then
  echo "bench: open-file limit is $(ulimit -n); area 5 needs about 10,100 per process (raise the hard limit)" >&2
fi

bin=$(mktemp -d "${TMPDIR:-/tmp}/heft-bench-bin.XXXXXX")
trap 'rm -rf "$bin"' EXIT
echo "bench: building binaries into $bin" >&2
go build -o "$bin/" ./agent/cmd/heft-agent ./coordinator/cmd/heft-coordinator ./sim/cmd/heft-sim \
  ./gateway/cmd/heft-sync ./bench/cmd/heftbench ./bench/cmd/swarm

"$bin/heftbench" --bin "$bin" --out bench/results/latest.md "$@"
