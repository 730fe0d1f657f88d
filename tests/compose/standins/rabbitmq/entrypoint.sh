#!/bin/sh
# The official image's start-up, reduced to what the compose files use: the server runs as
# the rabbitmq user, owning its data directory; any other command runs as is.
set -eu

if [ "$1" = rabbitmq-server ] && [ "$(id -u)" = 0 ]; then
	find /var/lib/rabbitmq \! -user rabbitmq -exec chown rabbitmq:rabbitmq '{}' +
	exec setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups "$0" "$@"
fi
exec "$@"
