#!/bin/sh
# Give the agent's user the groups it reads GPUs and logs with, enable the
# service on a fresh install but do not start it (it needs a configured
# coordinator URL and token first), and on upgrade restart it if it runs.
set -e

if [ -f /usr/lib/systemd/system/heft-agent.service ]; then
	# Only groups that exist: a unit naming a missing group would not start.
	# video, render: /dev/nvidia* on some distributions. systemd-journal, adm:
	# the journal. Not docker (root-equivalent): see the README.
	for g in video render systemd-journal adm; do
		if getent group "$g" >/dev/null 2>&1 && ! id -nG heft 2>/dev/null | tr ' ' '\n' | grep -qx "$g"; then
			usermod -a -G "$g" heft || true
		fi
	done
fi

if [ -f /usr/lib/systemd/system/heft-sync.service ]; then
	# HAProxy's admin socket is "mode 660 group haproxy": heft-sync reads and
	# sets it as a member of that group, where it exists.
	if getent group haproxy >/dev/null 2>&1 && ! id -nG heft 2>/dev/null | tr ' ' '\n' | grep -qx haproxy; then
		usermod -a -G haproxy heft || true
	fi
fi

command -v systemctl >/dev/null 2>&1 || exit 0
[ -d /run/systemd/system ] || exit 0
systemctl daemon-reload || true
fresh=no
case "$1" in
	1) fresh=yes ;;                                  # rpm: first install
	configure) [ -z "$2" ] && fresh=yes ;;           # deb: no previous version
esac
for u in heft-agent heft-coordinator heft-sync; do
	[ -f "/usr/lib/systemd/system/$u.service" ] || continue
	if [ "$fresh" = yes ]; then
		systemctl enable "$u.service" >/dev/null 2>&1 || true
		echo "$u: enabled, not started. Edit /etc/heft/${u#heft-}.toml, then: systemctl start $u"
	else
		systemctl try-restart "$u.service" >/dev/null 2>&1 || true
	fi
done
exit 0
