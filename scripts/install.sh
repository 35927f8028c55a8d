#!/bin/sh
# Install or upgrade heft-agent on a host without a package manager (Linux
# with systemd, or macOS with launchd): copy the binary, write the config,
# install the service, and start it, or restart it if it runs.
#
#   sudo ./install.sh --binary ./heft-agent --coordinator wss://heft.example:7070 \
#        --token-file ./agent.token [--node NAME] [--listen :7071] [--discover]
#        [--engine vllm=http://127.0.0.1:8000,log=/var/log/vllm.log]...
#   sudo ./install.sh --binary ./heft-agent      # upgrade: keeps the config, restarts a running agent
#
# --engine is the agent's own: KIND=URL[,log=LOG][,model=NAME][,advertise=URL], LOG an absolute
# path or glob, journald:UNIT, docker:CONTAINER or k8s:NAMESPACE/POD/CONTAINER.
# --discover writes discover = true: the agent finds the engines on the host itself (their
# processes, default ports, launch arguments and logs) and logs what it found.
# --listen HOST:PORT serves the agent's /metrics and /healthz there (":7071": every
# address, for a central Prometheus; the default is no port).
# Every option takes --opt value or --opt=value. Everything is checked before
# anything changes. An existing config or token is kept; what the flags say
# goes to agent.toml.new / agent.token.new. --no-start leaves the service as
# it is. --prefix DIR writes under DIR and starts nothing unless --start.
set -eu

prog=$(basename "$0")
die() { echo "$prog: $*" >&2; exit 1; }
nl='
'
# wire.EngineKinds; TestInstallScript checks the two lists agree.
kinds="vllm sglang mlx llamacpp ollama"

# tomlsafe refuses what would break the TOML string a value is written into.
tomlsafe() { # what value
	case "$2" in *'"'* | *'\'* | *"$nl"*) die "$1 '$2' cannot contain \", \\ or a line break" ;; esac
	if printf '%s' "$2" | LC_ALL=C grep -q '[[:cntrl:]]'; then die "$1 cannot contain control characters"; fi
}

binary="" coordinator="" token_file="" node="" listen="" prefix="" start=yes engines="" forced_start=no discover=no
while [ $# -gt 0 ]; do
	opt=$1 attached=no
	case "$opt" in
		--*=*) val=${opt#*=}; opt=${opt%%=*}; shift; set -- "$opt" "$val" "$@"; attached=yes ;;
	esac
	case "$opt" in
		--binary | --coordinator | --token-file | --node | --listen | --engine | --prefix)
			[ $# -ge 2 ] && [ -n "$2" ] || die "$opt needs a value"
			val=$2
			shift 2
			case "$opt" in
				--binary) binary=$val ;;
				--coordinator) coordinator=$val ;;
				--token-file) token_file=$val ;;
				--node) node=$val ;;
				--listen) listen=$val ;;
				--engine) tomlsafe --engine "$val"; engines="$engines$val$nl" ;;
				--prefix) prefix=$val ;;
			esac
			;;
		--discover)
			[ "$attached" = no ] || die "$opt takes no value"
			discover=yes
			shift
			;;
		--no-start | --start)
			[ "$attached" = no ] || die "$opt takes no value"
			[ "$opt" = --start ] && forced_start=yes || start=no
			shift
			;;
		-h | --help) sed -n '2,/^[^#]/p' "$0" | sed -n 's/^# \{0,1\}//p'; exit 0 ;;
		*) die "unknown flag $opt (see --help)" ;;
	esac
done
[ -z "$prefix" ] || [ "$forced_start" = yes ] || start=no


# check_log validates an engine's log source as the agent's logsource.Parse
# does, and also wants a path to be absolute (a service has no useful
# working directory). TestInstallScriptLogSpecs holds the two to one verdict.
check_log() { # spec value
	v=$2
	bad() { die "--engine '$1': log '$v' $2; give an absolute path or glob, journald:UNIT, docker:CONTAINER or k8s:NAMESPACE/POD/CONTAINER"; }
	matches() { printf '%s\n' "$1" | grep -Eq "$2"; }
	case "$v" in
		journald:*)
			matches "${v#journald:}" '^[A-Za-z0-9:_.@\\-]+$' || bad "$1" "does not name a systemd unit"
			;;
		docker:*)
			c=${v#docker:}
			matches "${c#/}" '^[a-zA-Z0-9][a-zA-Z0-9_.-]*$' || bad "$1" "does not name a Docker container"
			;;
		k8s:* | kubernetes:*)
			r=${v#*:}
			case "$r" in */*/*/* | "") bad "$1" "wants NAMESPACE/POD/CONTAINER" ;; */*/*) ;; *) bad "$1" "wants NAMESPACE/POD/CONTAINER" ;; esac
			ns=${r%%/*} r=${r#*/}
			pod=${r%%/*} ctr=${r#*/}
			label='^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$'
			matches "$ns" "$label" || bad "$1" "has no Kubernetes namespace name"
			case "$pod" in
				*[*?[]*) matches "$pod" '^[]a-z0-9.*?^![-]{1,253}$' || bad "$1" "has no pattern of pod names" ;;
				*) matches "$pod" '^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$' || bad "$1" "has no Kubernetes pod name" ;;
			esac
			matches "$ctr" "$label" || bad "$1" "has no Kubernetes container name"
			;;
		file:* | /*)
			f=${v#file:}
			case "$f" in /*) ;; *) bad "$1" "is not an absolute path" ;; esac
			case "${f%/*}" in *[*?[]*) bad "$1" "has a pattern in its folder (only the file name may hold *, ? or [)" ;; esac
			;;
		*)
			if matches "$v" '^[a-z][a-z0-9]*:'; then bad "$1" "has an unknown kind '${v%%:*}:'"; fi
			bad "$1" "is not an absolute path"
			;;
	esac
}

# check_engine validates one --engine like the agent's config.ParseEngine
# and Validate do: KIND=URL[,log=LOG][,model=NAME][,advertise=URL].
check_engine() { # spec
	spec=$1
	tomlsafe "--engine" "$spec"
	case "$spec" in *, | *,,*) die "--engine '$spec': an empty option (want KIND=URL[,log=LOG][,model=NAME][,advertise=URL])" ;; esac
	first=${spec%%,*}
	kind=${first%%=*} url=${first#*=}
	if [ "$kind" = "$first" ] || [ -z "$kind" ] || [ -z "$url" ]; then
		die "--engine '$spec': want KIND=URL[,log=LOG][,model=NAME][,advertise=URL]"
	fi
	case " $kinds " in *" $kind "*) ;; *) die "--engine '$spec': unknown engine kind '$kind' (want one of: $kinds)" ;; esac
	case "$url" in http://?* | https://?*) ;; *) die "--engine '$spec': url '$url' must start with http:// or https://" ;; esac
	rest=${spec#"$first"}
	while [ -n "$rest" ]; do
		rest=${rest#,}
		o=${rest%%,*}
		rest=${rest#"$o"}
		k=${o%%=*} v=${o#*=}
		[ "$k" != "$o" ] || die "--engine '$spec': '$o' is not key=value"
		case "$k" in
			log) check_log "$spec" "$v" ;;
			model) [ -n "$v" ] || die "--engine '$spec': model is empty" ;;
			advertise) case "$v" in
					http://?* | https://?*) ;;
					*) die "--engine '$spec': advertise '$v' must start with http:// or https://" ;;
				esac ;;
			*) die "--engine '$spec': unknown option '$k' (want log, model or advertise)" ;;
		esac
	done
}

# engine_toml writes one validated --engine as an [[engine]] block.
engine_toml() { # spec
	first=${1%%,*}
	echo "[[engine]]"
	echo "kind = \"${first%%=*}\""
	echo "url = \"${first#*=}\""
	rest=${1#"$first"}
	while [ -n "$rest" ]; do
		rest=${rest#,}
		o=${rest%%,*}
		rest=${rest#"$o"}
		k=${o%%=*}
		[ "$k" != advertise ] || k=advertise_url # the TOML key of --engine's advertise=
		echo "$k = \"${o#*=}\""
	done
}

# --- check everything; nothing changes before this section ends ---

os=${HEFT_INSTALL_UNAME:-$(uname -s)}
case "$os" in
	Linux) os=linux ;;
	Darwin) os=darwin ;;
	*) die "unsupported operating system '$os': heft-agent installs on Linux (systemd) and macOS (launchd)" ;;
esac
if [ "$os" = linux ]; then
	bindir=$prefix/usr/local/bin confdir=$prefix/etc/heft unitdir=$prefix/etc/systemd/system
	unit=$unitdir/heft-agent.service
	src=$(cd "$(dirname "$0")" && pwd)/../packaging/systemd/heft-agent.service
else
	bindir=$prefix/usr/local/bin confdir=$prefix/usr/local/etc/heft unitdir=$prefix/Library/LaunchDaemons
	unit=$unitdir/io.heft.agent.plist
	src=$(cd "$(dirname "$0")" && pwd)/../packaging/launchd/io.heft.agent.plist
fi
[ -f "$src" ] || die "cannot find $src (run this script from a heft checkout or release)"
conf=$confdir/agent.toml token=$confdir/agent.token
upgrade=no
[ -e "$conf" ] && upgrade=yes

if [ -n "$coordinator" ]; then
	tomlsafe --coordinator "$coordinator"
	case "$coordinator" in
		ws://?* | wss://?*) ;;
		*) die "--coordinator must be a ws:// or wss:// URL, got '$coordinator'" ;;
	esac
	hostport=${coordinator#*://}
	hostport=${hostport%%/*}
	case "$hostport" in "" | :*) die "--coordinator '$coordinator' has no host" ;; esac
	case "${coordinator#*://"$hostport"}" in
		"" | /)
			coordinator="${coordinator%%://*}://$hostport/api/v1/agent"
			echo "coordinator URL has no path: using $coordinator, the agent endpoint"
			;;
	esac
elif [ "$upgrade" = no ]; then
	die "--coordinator URL is required (e.g. wss://heft.example:7070/api/v1/agent)"
elif [ -n "$node$listen$engines" ] || [ "$discover" = yes ]; then
	die "$conf exists: give --coordinator too, so that agent.toml.new is a whole config"
fi
if [ -n "$token_file" ]; then
	[ -r "$token_file" ] && [ -f "$token_file" ] || die "cannot read token file '$token_file'"
	[ -n "$(tr -d ' \t\r\n' <"$token_file")" ] || die "token file '$token_file' is empty"
elif [ "$upgrade" = no ]; then
	die "--token-file FILE is required (a file holding the agent token)"
fi
if [ -n "$listen" ]; then
	tomlsafe --listen "$listen"
	lport=${listen##*:}
	case "$listen" in
		*:*) ;;
		*) die "--listen '$listen': want HOST:PORT, e.g. :7071 or 10.0.0.5:7071" ;;
	esac
	case "$lport" in
		"" | *[!0-9]*) die "--listen '$listen': port '$lport' is not a number" ;;
	esac
	[ "$lport" -le 65535 ] || die "--listen '$listen': port $lport is not 0..65535"
fi
if [ -n "$node" ]; then
	tomlsafe --node "$node"
	[ "${#node}" -le 253 ] || die "--node is longer than 253 characters"
	# The coordinator's node-name grammar: ASCII letters, digits, . _ -,
	# not starting with . or -.
	case "$node" in
		.* | -* | *[!A-Za-z0-9._-]*) die "--node '$node': use ASCII letters, digits, '.', '_' and '-', not starting with '.' or '-'" ;;
	esac
fi
old_ifs=$IFS
IFS=$nl
set -f # a log glob is the agent's to expand, not the shell's
for e in $engines; do check_engine "$e"; done
set +f
IFS=$old_ifs
if [ -z "$binary" ]; then
	binary=$(command -v heft-agent 2>/dev/null || true)
	[ -n "$binary" ] || die "--binary PATH is required (heft-agent not found on PATH)"
fi
[ -f "$binary" ] && [ -x "$binary" ] || die "'$binary' is not an executable file"
if [ -z "$prefix" ] && [ "$(id -u)" -ne 0 ]; then
	die "run as root (or pass --prefix DIR to install into a folder)"
fi
if [ "$start" = yes ]; then
	if [ "$os" = linux ]; then
		command -v systemctl >/dev/null 2>&1 || die "systemctl not found: pass --no-start and start heft-agent yourself"
	else
		command -v launchctl >/dev/null 2>&1 || die "launchctl not found: pass --no-start"
	fi
fi

# --- install ---

mkdir -p "$bindir" "$confdir" "$unitdir"
cp "$binary" "$bindir/heft-agent.new" && chmod 0755 "$bindir/heft-agent.new" && mv "$bindir/heft-agent.new" "$bindir/heft-agent"
echo "installed $bindir/heft-agent"

if [ -n "$token_file" ]; then
	if [ ! -e "$token" ]; then
		install -m 0600 "$token_file" "$token"
		echo "wrote $token"
	elif ! cmp -s "$token_file" "$token"; then
		install -m 0600 "$token_file" "$token.new"
		echo "kept $token; the token you gave is in $token.new (mv it over $token to use it)"
	fi
fi

if [ -n "$coordinator" ]; then
	target=$conf
	[ "$upgrade" = no ] || target=$conf.new
	{
		echo "# Written by $prog on $(date -u +%Y-%m-%dT%H:%M:%SZ)."
		[ -z "$listen" ] || echo "listen = \"$listen\""
		[ "$discover" = no ] || echo "discover = true"
		echo "[coordinator]"
		echo "url = \"$coordinator\""
		echo "token_file = \"${token#"$prefix"}\""
		if [ -n "$node" ]; then
			echo "[node]"
			echo "name = \"$node\""
		fi
		IFS=$nl
		set -f
		for e in $engines; do engine_toml "$e"; done
		set +f
		IFS=$old_ifs
	} >"$target.tmp"
	chmod 0640 "$target.tmp"
	mv "$target.tmp" "$target"
	if [ "$upgrade" = no ]; then
		echo "wrote $conf"
	else
		echo "kept $conf; the settings you gave are in $target (compare: diff -u $conf $target)"
	fi
else
	echo "kept $conf"
fi

if [ "$os" = linux ]; then
	sed -e "s|/usr/bin/heft-agent|/usr/local/bin/heft-agent|" "$src" >"$unit"
	echo "wrote $unit"
	if [ -z "$prefix" ]; then
		getent group heft >/dev/null 2>&1 || groupadd --system heft
		getent passwd heft >/dev/null 2>&1 ||
			useradd --system --gid heft --home-dir /var/lib/heft --no-create-home --shell /usr/sbin/nologin heft
		# The groups the agent reads GPUs and logs with, where they exist
		# (as packaging/scripts/postinstall.sh does). Not docker: see the README.
		for g in video render systemd-journal adm; do
			if getent group "$g" >/dev/null 2>&1; then usermod -a -G "$g" heft; fi
		done
		chgrp heft "$confdir" && chmod 0750 "$confdir"
		for f in "$conf" "$conf.new" "$token" "$token.new"; do
			[ ! -e "$f" ] || { chgrp heft "$f" && chmod 0640 "$f"; }
		done
	fi
	if [ "$start" = no ]; then
		if [ -z "$prefix" ] && systemctl is-active --quiet heft-agent.service 2>/dev/null; then
			echo "not restarted: heft-agent runs the old binary until: systemctl daemon-reload && systemctl restart heft-agent"
		else
			echo "not started: systemctl daemon-reload && systemctl enable --now heft-agent"
		fi
	elif systemctl is-active --quiet heft-agent.service; then
		systemctl daemon-reload
		systemctl restart heft-agent.service
		echo "restarted heft-agent (journalctl -u heft-agent -f)"
	else
		systemctl daemon-reload
		systemctl enable --now heft-agent.service
		echo "started heft-agent (journalctl -u heft-agent -f)"
	fi
else
	cp "$src" "$unit"
	mkdir -p "$prefix/usr/local/var/log"
	echo "wrote $unit"
	if [ "$start" = no ]; then
		echo "not started: launchctl bootstrap system $unit"
	elif launchctl print system/io.heft.agent >/dev/null 2>&1; then
		# bootout and bootstrap again, so a changed plist counts too.
		launchctl bootout system/io.heft.agent
		launchctl bootstrap system "$unit"
		echo "restarted heft-agent (tail -f /usr/local/var/log/heft-agent.log)"
	else
		launchctl bootstrap system "$unit"
		echo "started heft-agent (tail -f /usr/local/var/log/heft-agent.log)"
	fi
fi
