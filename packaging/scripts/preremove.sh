#!/bin/sh
# Stop and disable the service on final removal only (not on upgrade).
set -e
command -v systemctl >/dev/null 2>&1 || exit 0
case "$1" in
	0|remove) ;;
	*) exit 0 ;;
esac
for u in heft-agent heft-coordinator heft-sync; do
	[ -f "/usr/lib/systemd/system/$u.service" ] || continue
	systemctl disable --now "$u.service" >/dev/null 2>&1 || true
done
exit 0
