#!/usr/bin/env bash
# Runs the image's build on this host without a Docker engine: copies the build context the
# way `COPY . .` would (minus what .dockerignore leaves out), runs the Dockerfile's own build
# RUN command in it, then starts the built binary with the environment the image and
# docker/compose.yml give it (`version`, `config check`, `healthcheck`), secrets read through
# the *_FILE variables from docker/secrets. Catches a Dockerfile or compose file that drifted
# from what the relay builds with and reads. Usage: docker/build-on-host.sh [--keep]
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dockerfile=$root/docker/Dockerfile
compose=$root/docker/compose.yml
keep=0
[ "${1:-}" = "--keep" ] && keep=1

die() {
	echo "build-on-host: $*" >&2
	exit 1
}

work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-relay-image.XXXXXX")
cleanup() {
	if [ $keep -eq 1 ]; then
		echo "build-on-host: left $work"
	else
		rm -rf "$work"
	fi
}
trap cleanup EXIT

# The build context, filtered like .dockerignore does (local build trees, VCS data, secrets).
mkdir -p "$work/src"
tar -C "$root" --exclude=./.git --exclude=./build --exclude='./build-*' \
	--exclude=./docker/secrets --exclude=CMakeFiles --exclude=CMakeCache.txt \
	--exclude='*.o' --exclude='*.a' -cf - . | tar -C "$work/src" -xf -

# The build stage's RUN instruction that runs cmake, with its continuation lines joined: the
# very commands the image runs, so that a change to the Dockerfile is what gets tested.
build_cmd=$(awk '
	/^FROM / { stage = ($0 ~ / AS build$/) }
	stage && /^RUN .*cmake -S/ { take = 1; sub(/^RUN[ \t]+/, "") }
	take {
		line = $0
		sub(/^[ \t]+/, "", line)
		more = sub(/[ \t]*\\$/, "", line)
		cmd = cmd (cmd == "" ? "" : " ") line
		if (!more) { print cmd; exit }
	}' "$dockerfile")
[ -n "$build_cmd" ] || die "no cmake RUN instruction in the build stage of $dockerfile"
case $build_cmd in
*-DCMAKE_BUILD_TYPE=Release*-DOUTBOX_TESTS=OFF*) ;;
*) die "the Dockerfile's build is no longer Release with -DOUTBOX_TESTS=OFF: $build_cmd" ;;
esac
echo "build-on-host: RUN $build_cmd"
(cd "$work/src" && bash -euo pipefail -c "$build_cmd")
bin=$work/src/build/outbox-relay
[ -x "$bin" ] || die "the build did not produce build/outbox-relay"

# The environment a container of the image gets: the Dockerfile's ENV lines, then one
# service's `environment:` map from compose.yml, with /run/secrets/NAME pointing at the file
# compose mounts there.
image_env() {
	awk '/^ENV OUTBOX_[A-Z0-9_]+=/ { sub(/^ENV[ \t]+/, ""); print }' "$dockerfile"
}

service_env() {
	awk -v svc="$1" '
		/^  [a-z][a-z0-9_-]*:$/ { in_svc = ($0 == "  " svc ":"); in_env = 0; next }
		/^[^ ]/ { in_svc = 0; in_env = 0 }
		in_svc && /^    environment:$/ { in_env = 1; next }
		in_svc && /^    [^ ]/ { in_env = 0 }
		in_env && /^      OUTBOX_[A-Z0-9_]+:/ {
			line = $0
			sub(/^[ \t]+/, "", line)
			key = line
			sub(/:.*/, "", key)
			val = line
			sub(/^[^:]*:[ \t]*/, "", val)
			gsub(/^"|"$/, "", val)
			print key "=" val
		}' "$compose"
}

# Maps a compose secret's name to its file (relative to docker/), from the top-level
# `secrets:` section.
secret_file() {
	awk -v name="$1" '
		/^secrets:$/ { top = 1; next }
		/^[^ #]/ { top = 0 }
		top && /^  [a-z_]+:$/ { cur = $1; sub(/:$/, "", cur); next }
		top && cur == name && /^    file:/ { sub(/^    file:[ \t]*/, ""); print; exit }
		' "$compose"
}

run_with_service_env() {
	local svc=$1
	shift
	local -a envv=("PATH=/usr/local/bin:/usr/bin:/bin" "HOME=/nonexistent")
	local kv key val name file
	while IFS= read -r kv; do
		[ -n "$kv" ] || continue
		key=${kv%%=*}
		val=${kv#*=}
		if [[ $key == *_FILE && $val == /run/secrets/* ]]; then
			name=${val#/run/secrets/}
			file=$(secret_file "$name")
			[ -n "$file" ] || die "service $svc: secret '$name' is not defined in compose.yml"
			val=$root/docker/$file
			[ -r "$val" ] || die "service $svc: secret file $val is missing"
		fi
		envv+=("$key=$val")
	done < <(image_env; service_env "$svc")
	env -i "${envv[@]}" "$bin" "$@"
}

echo "build-on-host: $("$bin" version)"
for svc in migrate relay; do
	[ -n "$(service_env "$svc")" ] || die "service $svc has no OUTBOX_* environment in compose.yml"
	echo "build-on-host: service $svc: $(service_env "$svc" | cut -d= -f1 | tr '\n' ' ')"
	run_with_service_env "$svc" config check ||
		die "service $svc: config check failed with the compose environment"
done
# The image's HEALTHCHECK command must parse its configuration: 1 (nothing ready to answer
# here) is expected, 2 would be a usage or configuration error.
rc=0
run_with_service_env relay healthcheck >/dev/null 2>&1 || rc=$?
[ $rc -le 1 ] || die "healthcheck exited $rc with the relay's compose environment"
echo "build-on-host: ok"
