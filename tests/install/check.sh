#!/usr/bin/env bash
# integration/install: `cmake --install` of the build under test into a temporary prefix, then
# liboutbox used from there as an application uses it:
#   - the layout, the SONAME, the shared library's exports (outbox_* and inbox_* only: the
#     base/ helpers it carries stay hidden) and the static library's objects;
#   - app.c built through pkg-config (shared; static liboutbox.a with libpq shared) and
#     through find_package(outbox) in a CMake project of its own (outbox::outbox and
#     outbox::outbox_static), each run against the test database: outbox_add inside a
#     transaction, then inbox_migrate / inbox_claim / inbox_confirm, and the rows they left;
#   - the headers: warn_unused_result on every function whose result must be checked, and
#     they compile as C++ (11 and 17).
#
# Usage: check.sh BUILD_DIR (ctest passes it). Environment: RELAY_TEST_PG and RELAY_TEST_AMQP
# (tests/services.sh), and from ctest RELAY_TEST_INSTALL_{CC,CMAKE,CFLAGS,LIBDIR,VERSION,SONAME}:
# the build's compiler, cmake, C flags (sanitizers: a program that links an instrumented
# library needs them), library directory, version and the shared library's SONAME.
set -euo pipefail
# (No `cmd | grep -q`: grep -q leaves at the first match, cmd may die of SIGPIPE, and
# pipefail then fails the pipeline. Output is captured first.)

here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: check.sh BUILD_DIR}
cc=${RELAY_TEST_INSTALL_CC:-cc}
cmake=${RELAY_TEST_INSTALL_CMAKE:-cmake}
read -r -a cflags <<<"${RELAY_TEST_INSTALL_CFLAGS:-}"
libdir=${RELAY_TEST_INSTALL_LIBDIR:-lib}
version=${RELAY_TEST_INSTALL_VERSION:?RELAY_TEST_INSTALL_VERSION is not set (run through ctest)}
soname=${RELAY_TEST_INSTALL_SONAME:?RELAY_TEST_INSTALL_SONAME is not set (run through ctest)}
: "${RELAY_TEST_PG:?RELAY_TEST_PG is not set (tests/services.sh sets it)}"
: "${RELAY_TEST_AMQP:?RELAY_TEST_AMQP is not set (tests/services.sh sets it)}"

work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
lib=$prefix/$libdir
name=inst_$$_$RANDOM
failed=0

step() { echo "install: $*" >&2; }
fail() {
	echo "install: FAILED: $*" >&2
	failed=1
}
die() {
	echo "install: FAILED: $*" >&2
	exit 1
}

# ---- the install ----
step "cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 ||
	{ cat "$work/install.log" >&2; die "cmake --install"; }
(cd "$prefix" && find . | sort) >&2
for f in bin/outbox-relay "$libdir/liboutbox.a" "$libdir/liboutbox.so" "$libdir/$soname" \
	"$libdir/liboutbox.so.$version" "$libdir/pkgconfig/outbox.pc" include/outbox/outbox.h \
	include/outbox/inbox.h "$libdir/cmake/outbox/outboxConfig.cmake" \
	"$libdir/cmake/outbox/outboxConfigVersion.cmake" "$libdir/cmake/outbox/outboxTargets.cmake"; do
	[ -e "$prefix/$f" ] || fail "$f is not installed"
done
[ $failed -eq 0 ] || exit 1

# ---- the shared library: SONAME and exports; the static one: the same objects ----
got=$(readelf -d "$lib/liboutbox.so" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
[ "$got" = "$soname" ] || fail "SONAME is '$got', not '$soname'"
[[ $soname =~ ^liboutbox\.so\.[0-9]+\.[0-9]+$ ]] || fail "SONAME '$soname' is not liboutbox.so.MAJOR.MINOR"
nm -D --defined-only "$lib/liboutbox.so" | awk '{print $NF}' | sort >"$work/exports"
step "exported: $(tr '\n' ' ' <"$work/exports")"
if grep -vE '^(outbox|inbox)_' "$work/exports" >"$work/extra"; then
	fail "the shared library exports more than the API: $(tr '\n' ' ' <"$work/extra")"
fi
for f in outbox_add inbox_schema_sql inbox_migrate inbox_claim inbox_confirm inbox_forget \
	inbox_purge; do
	grep -qx "$f" "$work/exports" || fail "the shared library does not export $f"
done
objects=$(ar t "$lib/liboutbox.a" | sort | tr '\n' ' ')
for o in outbox.c.o inbox.c.o utf8.c.o identifier.c.o json_scan.c.o trace_context.c.o; do
	[[ " $objects" == *" $o "* ]] || fail "liboutbox.a does not hold $o (it holds: $objects)"
done

# ---- the outbox table, by the installed relay ----
migrate() {
	env -i PATH="$PATH" HOME="${HOME:-/tmp}" ASAN_OPTIONS="${ASAN_OPTIONS:-}" \
		UBSAN_OPTIONS="${UBSAN_OPTIONS:-}" TSAN_OPTIONS="${TSAN_OPTIONS:-}" \
		OUTBOX_DATABASE_URL="$RELAY_TEST_PG" OUTBOX_AMQP_URL="$RELAY_TEST_AMQP" \
		OUTBOX_DATABASE_TABLE="$1" OUTBOX_DATABASE_CHANNEL="$1" OUTBOX_HTTP_LISTEN= \
		"$prefix/bin/outbox-relay" migrate >"$work/migrate.log" 2>&1 ||
		{ cat "$work/migrate.log" >&2; die "the installed outbox-relay could not migrate $1"; }
}

# Runs app (with the environment given before it) on tables of its own.
run_app() {
	local label=$1
	shift
	migrate "${name}_$label"
	if "$@" "$RELAY_TEST_PG" "${name}_$label" "${name}_${label}_in" >"$work/$label.out" 2>&1; then
		step "$label: $(tail -n 1 "$work/$label.out")"
	else
		cat "$work/$label.out" >&2
		fail "$label: the program failed"
	fi
}

# ---- pkg-config ----
export PKG_CONFIG_PATH=$lib/pkgconfig
step "pkg-config: $(pkg-config --cflags --libs outbox)"
[ "$(pkg-config --modversion outbox)" = "$version" ] || fail "pkg-config --modversion outbox"
[[ " $(pkg-config --cflags outbox) " == *" -I$prefix/include "* ]] ||
	fail "pkg-config --cflags outbox does not name $prefix/include"
[[ " $(pkg-config --libs outbox) " == *" -L$lib -loutbox "*"-lpq "* ]] ||
	fail "pkg-config --libs outbox is not -L$lib -loutbox ... -lpq"
[[ " $(pkg-config --static --libs outbox) " == *" -lpq "* ]] ||
	fail "pkg-config --static --libs outbox lacks libpq"
read -r -a pc_cflags <<<"$(pkg-config --cflags outbox)"
read -r -a pc_libs <<<"$(pkg-config --libs outbox)"

"$cc" "${cflags[@]}" -std=c11 -Wall -Wextra -Wpedantic -Werror -o "$work/app_pc" \
	"$here/app.c" "${pc_cflags[@]}" "${pc_libs[@]}" || die "building app.c through pkg-config"
grep -qF "$soname => $lib/$soname" <<<"$(LD_LIBRARY_PATH=$lib ldd "$work/app_pc")" ||
	fail "app_pc does not load $lib/$soname: $(LD_LIBRARY_PATH=$lib ldd "$work/app_pc")"
run_app pc env LD_LIBRARY_PATH="$lib" "$work/app_pc"

# Static: liboutbox.a by name, libpq shared (`pkg-config --static` also wants libpq's
# Libs.private, static libpgcommon and libpgport, which Debian's libpq-dev does not ship).
static_libs=()
for a in "${pc_libs[@]}"; do
	[ "$a" = -loutbox ] && a=-l:liboutbox.a
	static_libs+=("$a")
done
"$cc" "${cflags[@]}" -std=c11 -Wall -Wextra -Wpedantic -Werror -o "$work/app_pc_static" \
	"$here/app.c" "${pc_cflags[@]}" "${static_libs[@]}" || die "building app.c with liboutbox.a"
if grep -q liboutbox <<<"$(ldd "$work/app_pc_static" 2>&1)"; then
	fail "app_pc_static loads liboutbox.so"
fi
grep -q ' T outbox_add$' <<<"$(nm "$work/app_pc_static")" || fail "app_pc_static does not hold outbox_add"
run_app pc_static "$work/app_pc_static"

# ---- find_package(outbox) ----
step "find_package(outbox $version) in a project of its own"
if ! "$cmake" -S "$here/project" -B "$work/project" -DCMAKE_PREFIX_PATH="$prefix" \
	-DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="${cflags[*]}" -DCMAKE_BUILD_TYPE=None \
	-DOUTBOX_WANT_VERSION="$version" >"$work/project.log" 2>&1 ||
	! "$cmake" --build "$work/project" >>"$work/project.log" 2>&1; then
	cat "$work/project.log" >&2
	die "the CMake project did not build"
fi
grep -qF "$soname => $lib/$soname" <<<"$(ldd "$work/project/app_shared")" ||
	fail "app_shared does not load $lib/$soname: $(ldd "$work/project/app_shared")"
if grep -q liboutbox <<<"$(ldd "$work/project/app_static" 2>&1)"; then
	fail "app_static loads liboutbox.so"
fi
run_app cmake_shared "$work/project/app_shared"
run_app cmake_static "$work/project/app_static"
# A version of another minor is not taken (SameMinorVersion: 0.x minors may break the API).
if "$cmake" -S "$here/project" -B "$work/project-other" -DCMAKE_PREFIX_PATH="$prefix" \
	-DCMAKE_C_COMPILER="$cc" -DOUTBOX_WANT_VERSION=99.0 >"$work/other.log" 2>&1; then
	fail "find_package(outbox 99.0) found version $version"
fi

# ---- the headers ----
# Every result that must be checked: ignoring one is an error under -Werror. Compiled, not
# -fsyntax-only: GCC warns about an unused result only once it generates code.
calls=("outbox_add(c, 0, 0, 0, 0)" "inbox_schema_sql(0)" "inbox_migrate(c, 0, 0, 0)"
	"inbox_claim(c, 0, 0, 0, 1, 0, 0)" "inbox_confirm(c, 0, 0, 0, 0, 0)"
	"inbox_forget(c, 0, 0, 0, 0, 0)" "inbox_purge(c, 0, 0, 1, 0, 0)")
for call in "${calls[@]}"; do
	printf '#include <outbox/outbox.h>\n#include <outbox/inbox.h>\nvoid f(PGconn *c);\nvoid f(PGconn *c)\n{\n\t%s;\n}\n' \
		"$call" >"$work/ignored.c"
	"$cc" -std=c11 -c -o /dev/null -Wno-unused-result "${pc_cflags[@]}" "$work/ignored.c" ||
		fail "a call of ${call%%(*} does not compile"
	if "$cc" -std=c11 -c -o /dev/null -Werror=unused-result "${pc_cflags[@]}" \
		"$work/ignored.c" 2>/dev/null; then
		fail "ignoring the result of ${call%%(*} is not a warning"
	fi
done
if command -v c++ >/dev/null 2>&1; then
	cat >"$work/use.cpp" <<'EOF'
#include <outbox/outbox.h>
#include <outbox/inbox.h>
int use(PGconn *c);
int use(PGconn *c)
{
	outbox_message m = {};
	int rc = outbox_add(c, "outbox", &m, nullptr, 0);
	rc += inbox_claim(c, nullptr, "m", "me", 1000, nullptr, 0);
	return rc + inbox_confirm(c, nullptr, "m", "me", nullptr, 0);
}
EOF
	for std in c++11 c++17; do
		c++ -std=$std -fsyntax-only -Wall -Wextra -Wpedantic -Werror "${pc_cflags[@]}" \
			"$work/use.cpp" || fail "the headers do not compile as $std"
	done
	sed 's/int rc = outbox_add/outbox_add/; s/rc += inbox_claim/inbox_claim/; s/return rc + /return /' \
		"$work/use.cpp" >"$work/ignored.cpp"
	c++ -std=c++17 -c -o /dev/null -Wno-unused-result "${pc_cflags[@]}" "$work/ignored.cpp" ||
		fail "the C++ calls do not compile"
	if c++ -std=c++17 -c -o /dev/null -Werror=unused-result "${pc_cflags[@]}" \
		"$work/ignored.cpp" 2>/dev/null; then
		fail "ignoring a result in C++17 is not a warning"
	fi
else
	step "no C++ compiler: the C++ checks are skipped"
fi

[ $failed -eq 0 ] || exit 1
step "every check held"
