#!/bin/sh
# Enable the service on a fresh install but do not start it: it needs a
# configured coordinator URL and token first. On upgrade, restart it if it runs.
set -e

command -v systemctl >/dev/null 2>&1 || exit 0
[ -d /run/systemd/system ] || exit 0
systemctl daemon-reload || true
fresh=no
case "$1" in
	1) fresh=yes ;;                                  # rpm: first install
	configure) [ -z "$2" ] && fresh=yes ;;           # deb: no previous version
esac
for u in heft-agent heft-coordinator; do
	[ -f "/usr/lib/systemd/system/$u.service" ] || continue
	if [ "$fresh" = yes ]; then
		systemctl enable "$u.service" >/dev/null 2>&1 || true
		echo "$u: enabled, not started. Edit /etc/heft/${u#heft-}.toml, then: systemctl start $u"
	else
		systemctl try-restart "$u.service" >/dev/null 2>&1 || true
	fi
done
exit 0
