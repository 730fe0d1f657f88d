#!/usr/bin/env bash
# Installs the Debian packages outbox-relay needs to build, test, benchmark and demo, when
# any is missing. Shared by tests/run, bench/run and examples/demo so that the list lives in
# one place. Usage: tests/install-deps.sh CALLER_NAME
set -euo pipefail

caller=${1:-install-deps}
packages=(build-essential cmake pkg-config libpq-dev librabbitmq-dev libjansson-dev
	libcriterion-dev libmicrohttpd-dev postgresql rabbitmq-server openssl ca-certificates
	procps iproute2 util-linux mount libc-bin libnss-wrapper clang-format pgbouncer clang
	libclang-rt-14-dev cppcheck dpkg-dev file systemd adduser man-db groff-base mandoc prometheus
	docker.io docker-compose debootstrap curl)
# What each stage of tests/run uses beyond a minimal Debian 12 root (debootstrap
# --variant=minbase bookworm), which has neither procps nor iproute2 nor file:
# - services and the HA suite: procps (ps), iproute2 (ss), util-linux (runuser, setsid, ipcrm,
#   unshare), openssl (the TLS test certificates);
# - the fault suite gives one relay a hosts file of its own: libnss-wrapper (preloaded; no
#   mount namespace, so it works alike in a container, a chroot or as another user) and getent
#   (libc-bin);
# - fuzzing (tests/fuzz/run): clang with libclang-rt-14-dev, its libFuzzer and sanitizer
#   runtimes (without it clang cannot link -fsanitize=fuzzer);
# - the Debian packages and the man page: dpkg-dev has dpkg-shlibdeps (CPack's library
#   dependencies) and dpkg-buildflags; file is what CPackDeb runs on every installed file
#   ("CPackDeb: file utility is not available" without it); systemd has systemd-analyze (the
#   units are verified offline, no systemd needs to run); adduser runs in the package's
#   postinst; man-db, groff-base and mandoc render and lint the man page (tests/unit/test_manpage,
#   tests/package);
# - prometheus has promtool, which checks packaging/alerts.yml (its server is never started:
#   see policy-rc.d);
# - the Compose deployment (tests/compose/run): docker.io, docker-compose and debootstrap run it
#   on a dockerd of the test's own (the package's own docker service is not started), curl
#   reads the relay's endpoints.

missing=()
for p in "${packages[@]}"; do
	if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != 'install ok installed' ]; then
		missing+=("$p")
	fi
done
[ ${#missing[@]} -gt 0 ] || exit 0
if [ "$(id -u)" -ne 0 ]; then
	echo "$caller: missing packages: ${missing[*]}" >&2
	echo "$caller: run it with sudo (or as root) to install them, or install them yourself" >&2
	exit 1
fi
# The packages' postinst scripts would start the distribution's default PostgreSQL, PgBouncer and
# RabbitMQ services; we start our own, so a policy-rc.d denies those starts.
created_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
	printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
	chmod 755 /usr/sbin/policy-rc.d
	created_policy=1
fi
echo "$caller: installing: ${missing[*]}"
rc=0
apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
	"${missing[@]}" || rc=$?
if [ $created_policy -eq 1 ]; then
	rm -f /usr/sbin/policy-rc.d
fi
exit $rc
