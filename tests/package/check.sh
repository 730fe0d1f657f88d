#!/usr/bin/env bash
# package/debian: the Debian packages built, installed on this machine, checked and purged.
#   1. a Release build of its own (dpkg-buildflags' hardening flags, prefix /usr), then
#      `cpack -G DEB`: outbox-relay, liboutbox0.1 and liboutbox-dev;
#   2. `dpkg -i` of the three, then: `outbox-relay version`; `config check` of the packaged
#      /etc/outbox-relay/relay.json, as root and as the outbox-relay user; that file equal to
#      `config example`; the conffiles and their modes; the system user and group; the unit
#      through `systemd-analyze verify` (alone, with the credentials drop-in, with the migrate
#      drop-in and with both; no systemd needs to run), and its exposure through `systemd-analyze security --offline`; the man
#      page through man(1); liboutbox through pkg-config, a program linked against it and
#      ldconfig;
#      every package's /usr/share/doc/<package>/copyright (MIT);
#   3. `dpkg --remove`: every file `dpkg -L` listed is gone but the conffiles; `dpkg --purge`:
#      the conffiles and /etc/outbox-relay are gone too, the system user stays (Debian keeps
#      system users).
# Whatever happens, the packages are purged at the end and a user the test made is deleted.
#
# It installs packages system-wide, so it runs only when asked: RELAY_TEST_PACKAGE=1, as root
# (tests/run's package stage). Otherwise it exits 77, which ctest reports as skipped.
#
# Usage: check.sh SOURCE_DIR BUILD_DIR VERSION (ctest passes them; BUILD_DIR is its own).
set -euo pipefail
# (No `cmd | grep -q` below: grep -q leaves early, cmd dies of SIGPIPE and pipefail fails it.)

src=${1:?usage: check.sh SOURCE_DIR BUILD_DIR VERSION}
build=${2:?usage: check.sh SOURCE_DIR BUILD_DIR VERSION}
version=${3:?usage: check.sh SOURCE_DIR BUILD_DIR VERSION}
packages=(outbox-relay liboutbox-dev liboutbox0.1)
# Set while the packages may be on this machine because of this test: a run that was killed
# before its cleanup leaves it, and the next run purges what it left.
marker=/var/lib/outbox-relay-package-test
user_made=0
failed=0

step() { echo "package: $*" >&2; }
fail() {
	echo "package: FAILED: $*" >&2
	failed=1
}
die() {
	echo "package: FAILED: $*" >&2
	exit 1
}

if [ "${RELAY_TEST_PACKAGE:-}" != 1 ]; then
	echo "package: skipped: this test installs packages system-wide; RELAY_TEST_PACKAGE=1" \
		"(as root) runs it" >&2
	exit 77
fi
[ "$(id -u)" -eq 0 ] || die "must run as root (dpkg -i)"
for tool in cpack dpkg-deb dpkg-shlibdeps systemd-analyze man pkg-config cc adduser; do
	command -v "$tool" >/dev/null || die "$tool is not installed (tests/install-deps.sh)"
done

installed() { dpkg-query -W -f='${db:Status-Abbrev}' "$1" 2>/dev/null | grep '^.[^n]' >/dev/null; }
purge_all() {
	local p
	for p in "${packages[@]}"; do
		if installed "$p"; then
			dpkg --purge "$p" >&2 || true
		fi
	done
}

# A user left by an interrupted run is the test's to delete; one that was here before is not.
if [ -e "$marker" ] || ! getent passwd outbox-relay >/dev/null; then
	user_made=1
fi
for p in "${packages[@]}"; do
	if installed "$p"; then
		[ -e "$marker" ] || die "$p is installed on this machine and not by this test:" \
			"purge it first (dpkg --purge $p)"
		step "purging $p, left by an interrupted run"
	fi
done
purge_all

work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-package.XXXXXX")
cleanup() {
	local rc=$?
	purge_all
	if [ $user_made -eq 1 ]; then
		userdel outbox-relay 2>/dev/null || true
		groupdel outbox-relay 2>/dev/null || true
	fi
	rm -f "$marker"
	rm -rf "$work"
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- 1. build ----
step "Release build in $build (the packaging flags, warnings as errors: what -O2 and _FORTIFY_SOURCE see)"
CFLAGS="$(dpkg-buildflags --get CFLAGS) $(dpkg-buildflags --get CPPFLAGS)"
LDFLAGS=$(dpkg-buildflags --get LDFLAGS)
export CFLAGS LDFLAGS
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
	-DOUTBOX_TESTS=OFF -DOUTBOX_WERROR=ON >"$work/configure.log" 2>&1 || { cat "$work/configure.log" >&2; die "cmake"; }
cmake --build "$build" -j2 >"$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; die "build"; }
rm -f "$build"/*.deb
(cd "$build" && cpack -G DEB) >"$work/cpack.log" 2>&1 || { cat "$work/cpack.log" >&2; die "cpack"; }
debs=()
for p in "${packages[@]}"; do
	f=$(ls "$build/${p}_${version}_"*.deb 2>/dev/null || true)
	[ -f "$f" ] || die "cpack made no package $p (made: $(ls "$build"/*.deb))"
	debs+=("$f")
	step "$(basename "$f"): Depends: $(dpkg-deb -f "$f" Depends)"
done
# The runtime package depends on libraries, not on anything used only to build.
deps=$(dpkg-deb -f "$build/outbox-relay_${version}_"*.deb Depends)
for lib in libpq5 librabbitmq4 libjansson4 libmicrohttpd12 libc6 adduser; do
	[[ ", $deps," == *", $lib"[\ ,]* ]] || fail "outbox-relay does not depend on $lib: $deps"
done
if grep -qE '(-dev|cmake|gcc|pkg-config|pkgconf)\b' <<<"$deps"; then
	fail "outbox-relay depends on a build tool: $deps"
fi

# ---- 2. install ----
touch "$marker"
step "dpkg -i ${debs[*]##*/}"
dpkg -i "${debs[@]}" >"$work/install.log" 2>&1 || { cat "$work/install.log" >&2; die "dpkg -i"; }
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" | grep 'install ok installed' >/dev/null ||
		fail "$p is not installed: $(dpkg-query -W -f='${Status}' "$p")"
	# What the package put here: its files and links, and the directories of its own.
	dpkg -L "$p" | while IFS= read -r f; do
		if [ ! -d "$f" ]; then
			echo "$f" >>"$work/$p.files"
		elif [[ $f == *outbox* ]]; then
			echo "$f" >>"$work/$p.dirs"
		fi
	done
	touch "$work/$p.files" "$work/$p.dirs"
done

# The relay as the service runs it: its clean environment, the packaged file.
relay_env=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin)
got=$("${relay_env[@]}" outbox-relay version) || fail "outbox-relay version exited $?"
[ "$got" = "outbox-relay $version" ] || fail "outbox-relay version says '$got'"
"${relay_env[@]}" outbox-relay --config /etc/outbox-relay/relay.json config check >&2 ||
	fail "config check of /etc/outbox-relay/relay.json (root)"
runuser -u outbox-relay -- "${relay_env[@]}" outbox-relay \
	--config /etc/outbox-relay/relay.json config check >&2 ||
	fail "config check of /etc/outbox-relay/relay.json as the outbox-relay user"
"${relay_env[@]}" outbox-relay config example >"$work/example.json"
cmp -s "$work/example.json" /etc/outbox-relay/relay.json ||
	fail "/etc/outbox-relay/relay.json is not what \`outbox-relay config example\` prints"
# The environment file sets nothing until an operator does.
set_vars=$(env -i sh -c 'set -a; . /etc/default/outbox-relay; env' | grep '^OUTBOX_' || true)
[ -z "$set_vars" ] || fail "/etc/default/outbox-relay sets $set_vars"

conffiles=$(dpkg-query -W -f='${Conffiles}' outbox-relay)
for f in /etc/outbox-relay/relay.json /etc/default/outbox-relay; do
	grep -q "^ $f " <<<"$conffiles" || fail "$f is not a conffile: $conffiles"
done
[ "$(stat -c '%a %U %G' /etc/default/outbox-relay)" = "600 root root" ] ||
	fail "/etc/default/outbox-relay is $(stat -c '%a %U %G' /etc/default/outbox-relay)"
[ "$(stat -c '%a' /etc/outbox-relay/relay.json)" = 644 ] ||
	fail "/etc/outbox-relay/relay.json is mode $(stat -c '%a' /etc/outbox-relay/relay.json)"

# The licence: every package carries its machine-readable copyright file, as Debian wants.
for p in "${packages[@]}"; do
	grep -q '^License: MIT$' "/usr/share/doc/$p/copyright" 2>/dev/null ||
		fail "/usr/share/doc/$p/copyright is missing or does not name the MIT licence"
done

# The system user: no home, no login shell, a system uid, a group of its own.
IFS=: read -r _ _ uid gid _ home shell < <(getent passwd outbox-relay) ||
	die "postinst made no outbox-relay user"
step "user outbox-relay: uid $uid gid $gid home $home shell $shell"
[ "$uid" -lt 1000 ] || fail "outbox-relay has uid $uid, not a system uid"
if [ "$home" != /nonexistent ] || [ -e /nonexistent ]; then
	fail "outbox-relay's home is $home"
fi
[[ $shell == */nologin || $shell == */false ]] || fail "outbox-relay's shell is $shell"
[ "$(getent group outbox-relay | cut -d: -f3)" = "$gid" ] || fail "no outbox-relay group"
# Installing again (an upgrade to the same version) keeps the user and says nothing of it.
dpkg -i "${debs[0]}" >"$work/reinstall.log" 2>&1 || { cat "$work/reinstall.log" >&2; fail "dpkg -i again"; }
[ "$(id -u outbox-relay)" = "$uid" ] || fail "a second install changed the user"

# The unit, offline: systemd need not run (it does not, in a container or chroot). It must be
# clean: verify prints warnings with exit status 0, so its output must be empty too.
unit=/lib/systemd/system/outbox-relay.service
if ! out=$(systemd-analyze verify "$unit" 2>&1) || [ -n "$out" ]; then
	fail "systemd-analyze verify $unit: $out"
fi
mkdir -p "$work/unit/outbox-relay.service.d"
cp "$unit" "$work/unit/"
cp /usr/share/doc/outbox-relay/examples/credentials.conf "$work/unit/outbox-relay.service.d/"
if ! out=$(systemd-analyze verify "$work/unit/outbox-relay.service" 2>&1) || [ -n "$out" ]; then
	fail "systemd-analyze verify with the credentials drop-in: $out"
fi
# The migrate step (ExecStartPre=) with the credentials drop-in, as an operator installs both.
[ -f /usr/share/doc/outbox-relay/examples/migrate.conf ] ||
	fail "the package lacks /usr/share/doc/outbox-relay/examples/migrate.conf"
cp /usr/share/doc/outbox-relay/examples/migrate.conf "$work/unit/outbox-relay.service.d/"
if ! out=$(systemd-analyze verify "$work/unit/outbox-relay.service" 2>&1) || [ -n "$out" ]; then
	fail "systemd-analyze verify with the migrate and credentials drop-ins: $out"
fi
rm "$work/unit/outbox-relay.service.d/credentials.conf"
if ! out=$(systemd-analyze verify "$work/unit/outbox-relay.service" 2>&1) || [ -n "$out" ]; then
	fail "systemd-analyze verify with the migrate drop-in: $out"
fi
# Exposure, 0 (none) to 10 (unprotected); ours is about 1.4: a regression fails here.
systemd-analyze security --offline=true --threshold=25 "$unit" >"$work/security.log" 2>&1 ||
	{ cat "$work/security.log" >&2; fail "systemd-analyze security: exposure over 2.5"; }
step "$(grep 'Overall exposure' "$work/security.log" || true)"

# The man page, as man(1) finds and renders it.
[ "$(man -w outbox-relay)" = /usr/share/man/man1/outbox-relay.1.gz ] ||
	fail "man -w outbox-relay: $(man -w outbox-relay 2>&1)"
out=$(MANWIDTH=80 man --warnings outbox-relay 2>&1 >"$work/man.txt") || fail "man outbox-relay"
[ -z "$out" ] || fail "man outbox-relay warns: $out"
grep -q 'relay.batch_size' "$work/man.txt" || fail "the rendered man page lacks the key list"

# liboutbox: found through pkg-config, linked and loaded from the system directories.
[ "$(pkg-config --modversion outbox)" = "$version" ] || fail "pkg-config --modversion outbox"
cat >"$work/app.c" <<'EOF'
#include <outbox/outbox.h>
#include <outbox/inbox.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void)
{
	char *sql = inbox_schema_sql("inbox");
	int ok = sql && strstr(sql, "CREATE TABLE") != NULL;

	free(sql);
	puts(ok ? "liboutbox works" : "liboutbox gave no DDL");
	return !ok;
}
EOF
# shellcheck disable=SC2046
cc -o "$work/app" "$work/app.c" $(pkg-config --cflags --libs outbox) >&2 ||
	fail "a program does not build against the installed liboutbox"
if [ -x "$work/app" ]; then
	ldd "$work/app" | grep -E 'liboutbox.so.0.1 => (/usr)?/lib/' >/dev/null ||
		fail "the program does not load liboutbox.so.0.1 from the system library directory: $(ldd "$work/app")"
	"$work/app" >&2 || fail "the program linked against liboutbox fails"
fi
ldconfig -p | grep 'liboutbox.so.0.1 ' >/dev/null || fail "ldconfig does not know liboutbox.so.0.1"
[ $failed -eq 0 ] || exit 1

# ---- 3. remove, then purge ----
step "dpkg --remove"
dpkg --remove "${packages[@]}" >"$work/remove.log" 2>&1 || { cat "$work/remove.log" >&2; die "dpkg --remove"; }
for p in "${packages[@]}"; do
	while IFS= read -r f; do
		case $f in
		/etc/outbox-relay/relay.json | /etc/default/outbox-relay)
			[ -f "$f" ] || fail "dpkg --remove removed the conffile $f"
			;;
		*) if [ -e "$f" ] || [ -L "$f" ]; then fail "$f is still there after dpkg --remove"; fi ;;
		esac
	done <"$work/$p.files"
	while IFS= read -r d; do
		[ "$d" = /etc/outbox-relay ] || [ ! -e "$d" ] ||
			fail "the directory $d is still there after dpkg --remove"
	done <"$work/$p.dirs"
done
step "dpkg --purge"
dpkg --purge "${packages[@]}" >"$work/purge.log" 2>&1 || { cat "$work/purge.log" >&2; die "dpkg --purge"; }
for p in "${packages[@]}"; do
	! installed "$p" || fail "$p is still known to dpkg: $(dpkg-query -W -f='${Status}' "$p")"
done
for f in /etc/outbox-relay/relay.json /etc/default/outbox-relay /etc/outbox-relay; do
	[ ! -e "$f" ] || fail "$f is still there after dpkg --purge"
done
for p in "${packages[@]}"; do
	while IFS= read -r f; do
		if [ -e "$f" ] || [ -L "$f" ]; then fail "$f is still there after dpkg --purge"; fi
	done < <(cat "$work/$p.files" "$work/$p.dirs")
done
getent passwd outbox-relay >/dev/null || fail "dpkg --purge removed the system user"
[ $failed -eq 0 ] || exit 1
step "ok"
