#!/bin/sh
set -eu
if [ "$1" = redis-server ]; then
    shift
    chown redis:redis /data
    exec setpriv --reuid=redis --regid=redis --init-groups redis-server --protected-mode no "$@"
fi
exec "$@"
