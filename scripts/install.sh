#!/bin/sh
# Install heft-agent on a host without a package manager (Linux with systemd,
# or macOS with launchd): copy the binary, write the config from flags, install
# the service, and start it.
#
#   sudo ./install.sh --binary ./heft-agent --coordinator wss://heft.example:7070/api/v1/agent \
#        --token-file /path/to/agent.token [--node NAME] [--engine vllm=http://127.0.0.1:8000]
#
# --prefix DIR installs under DIR instead of / and starts nothing (used by the
# tests; also handy to see what would be written). --no-start writes everything
# but leaves the service stopped.
set -eu

prog=$(basename "$0")
die() { echo "$prog: $*" >&2; exit 1; }

binary="" coordinator="" token_file="" node="" prefix="" start=yes engines=""
while [ $# -gt 0 ]; do
	case "$1" in
		--binary) binary=${2:?}; shift 2 ;;
		--coordinator) coordinator=${2:?}; shift 2 ;;
		--token-file) token_file=${2:?}; shift 2 ;;
		--node) node=${2:?}; shift 2 ;;
		--engine) engines="$engines ${2:?}"; shift 2 ;;
		--prefix) prefix=${2:?}; start=no; shift 2 ;;
		--no-start) start=no; shift ;;
		-h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
		*) die "unknown flag $1 (see --help)" ;;
	esac
done

os=${HEFT_INSTALL_UNAME:-$(uname -s)}
case "$os" in
	Linux) os=linux ;;
	Darwin) os=darwin ;;
	*) die "unsupported operating system '$os': heft-agent installs on Linux (systemd) and macOS (launchd)" ;;
esac

[ -n "$coordinator" ] || die "--coordinator URL is required (e.g. ws://127.0.0.1:7070/api/v1/agent)"
case "$coordinator" in ws://*|wss://*) ;; *) die "--coordinator must be a ws:// or wss:// URL, got '$coordinator'" ;; esac
[ -n "$token_file" ] || die "--token-file FILE is required (a file holding the agent token)"
[ -r "$token_file" ] || die "cannot read token file '$token_file'"
if [ -z "$binary" ]; then
	binary=$(command -v heft-agent 2>/dev/null || true)
	[ -n "$binary" ] || die "--binary PATH is required (heft-agent not found on PATH)"
fi
[ -x "$binary" ] || die "'$binary' is not an executable file"
if [ -z "$prefix" ] && [ "$(id -u)" -ne 0 ]; then
	die "run as root (or pass --prefix DIR to install into a folder)"
fi

if [ "$os" = linux ]; then
	bindir=$prefix/usr/local/bin confdir=$prefix/etc/heft unitdir=$prefix/etc/systemd/system
else
	bindir=$prefix/usr/local/bin confdir=$prefix/usr/local/etc/heft unitdir=$prefix/Library/LaunchDaemons
fi
mkdir -p "$bindir" "$confdir" "$unitdir"

cp "$binary" "$bindir/heft-agent.new" && chmod 0755 "$bindir/heft-agent.new" && mv "$bindir/heft-agent.new" "$bindir/heft-agent"
echo "installed $bindir/heft-agent"

install -m 0600 "$token_file" "$confdir/agent.token"
conf=$confdir/agent.toml
{
	echo "# Written by $prog on $(date -u +%Y-%m-%dT%H:%M:%SZ)."
	echo "[coordinator]"
	echo "url = \"$coordinator\""
	echo "token_file = \"${confdir#"$prefix"}/agent.token\""
	if [ -n "$node" ]; then
		echo "[node]"
		echo "name = \"$node\""
	fi
	for e in $engines; do
		kind=${e%%=*} url=${e#*=}
		[ "$kind" != "$e" ] || die "--engine wants KIND=URL, got '$e'"
		echo "[[engine]]"
		echo "kind = \"$kind\""
		echo "url = \"$url\""
	done
} >"$conf.new"
chmod 0640 "$conf.new"
mv "$conf.new" "$conf"
echo "wrote $conf"

here=$(cd "$(dirname "$0")" && pwd)
if [ "$os" = linux ]; then
	unit=$unitdir/heft-agent.service
	src=$here/../packaging/systemd/heft-agent.service
	[ -f "$src" ] || die "cannot find $src (run this script from a heft checkout or release)"
	sed -e "s|/usr/bin/heft-agent|/usr/local/bin/heft-agent|" "$src" >"$unit"
	echo "wrote $unit"
	if [ -z "$prefix" ] && ! getent passwd heft >/dev/null 2>&1; then
		useradd --system --user-group --no-create-home --shell /usr/sbin/nologin heft
	fi
	[ -n "$prefix" ] || chgrp heft "$conf" "$confdir/agent.token"
	[ -n "$prefix" ] || chmod 0640 "$confdir/agent.token"
	if [ "$start" = yes ]; then
		systemctl daemon-reload
		systemctl enable --now heft-agent.service
		echo "started heft-agent (journalctl -u heft-agent -f)"
	else
		echo "not started: systemctl daemon-reload && systemctl enable --now heft-agent"
	fi
else
	plist=$unitdir/io.heft.agent.plist
	src=$here/../packaging/launchd/io.heft.agent.plist
	[ -f "$src" ] || die "cannot find $src (run this script from a heft checkout or release)"
	cp "$src" "$plist"
	mkdir -p "$prefix/usr/local/var/log"
	echo "wrote $plist"
	if [ "$start" = yes ]; then
		launchctl bootout system/io.heft.agent 2>/dev/null || true
		launchctl bootstrap system "$plist"
		echo "started heft-agent (tail -f /usr/local/var/log/heft-agent.log)"
	else
		echo "not started: launchctl bootstrap system $plist"
	fi
fi
