#!/bin/sh
# Entrypoint of fkmat's locally built Redis test image, shaped like the official
# redis image: arguments go to redis-server, protected mode is off when no
# configuration file is given, data lives in /data.
set -eu
if [ "${1#-}" != "$1" ] || [ $# -eq 0 ]; then
	set -- redis-server "$@"
fi
if [ "$1" = redis-server ]; then
	shift
	mkdir -p /data
	chown redis:redis /data
	cd /data
	case "${1:-}" in
	*.conf) ;;
	*) set -- --protected-mode no "$@" ;;
	esac
	exec setpriv --reuid=redis --regid=redis --init-groups redis-server "$@"
fi
exec "$@"
