#!/bin/sh
# Runs the test suite (make test) with six CPU-bound hogs beside
# it, a load of about 8 on a 2-core machine, as a busy CI host gives: the
# suite must pass there too. With package arguments it runs only
# `go test -race -count=1 PACKAGES` under the same load (no fuzz).
# The hogs are killed when the script ends, however it ends. It prints the
# result and the wall time.
#
#   scripts/test-under-load.sh                 # the whole suite
#   scripts/test-under-load.sh ./sim/ ./e2e/   # some packages
set -u
GO=${GO:-go}
HOGS=${HOGS:-6}

pids=""
stop() {
	for p in $pids; do kill "$p" 2>/dev/null; done
	for p in $pids; do wait "$p" 2>/dev/null; done
	pids=""
}
trap stop EXIT
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM

i=0
while [ "$i" -lt "$HOGS" ]; do
	sh -c 'while :; do :; done' &
	pids="$pids $!"
	i=$((i + 1))
done
echo "test-under-load: $HOGS CPU hogs running (pids$pids) on $(nproc) cores"

start=$(date +%s)
if [ "$#" -gt 0 ]; then
	$GO test -race -count=1 -timeout 30m "$@"
	rc=$?
else
	make test GO="$GO"
	rc=$?
fi
end=$(date +%s)
stop
load=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)
if [ "$rc" -eq 0 ]; then result=PASS; else result="FAIL (exit $rc)"; fi
echo "test-under-load: $result in $((end - start)) s, load average at the end $load"
exit "$rc"
