#!/bin/sh
# Create the heft system user before files owned by it are unpacked.
set -e
if ! getent group heft >/dev/null 2>&1; then
	groupadd --system heft
fi
if ! getent passwd heft >/dev/null 2>&1; then
	useradd --system --gid heft --home-dir /var/lib/heft --no-create-home \
		--shell /usr/sbin/nologin --comment "heft service user" heft
fi
exit 0
