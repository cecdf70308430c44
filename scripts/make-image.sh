#!/usr/bin/env bash
# Builds the OCI image sluice:<version> from a build directory, without a base
# image: the root is made here from the build's four programs, the shared
# libraries ldd says they load (with the dynamic loader), an /etc/passwd and
# /etc/group with the non-root user sluice (10001), an nsswitch.conf, /tmp and
# the dispatcher's work dir /var/lib/sluice; /bin/sh (dash) runs the entry
# point, which starts a program by name (docs/operations.md#the-image).
#
# usage: scripts/make-image.sh BUILD_DIR [TAG]
#   TAG defaults to sluice:<the CMake project version>. Uses podman, else buildah.
#   Reproducible: the image's creation time and every file's time are
#   SOURCE_DATE_EPOCH (default: the time of the checkout's last commit), so
#   two builds from one build directory are the same image, byte for byte.
set -euo pipefail
build=${1:?usage: make-image.sh BUILD_DIR [TAG]}
cd "$(dirname "$0")/.."
root_dir=$PWD
build=$(cd "$build" && pwd)

version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
[[ -n "$version" ]] || { echo "make-image: no project version in $build/CMakeCache.txt" >&2; exit 1; }
tag=${2:-sluice:$version}

programs=("$build/dispatcher/sluice-dispatcher" "$build/workerd/sluice-workerd"
          "$build/client/sluice-cat" "$build/client/sluicectl")
for p in "${programs[@]}"; do
  [[ -x "$p" ]] || { echo "make-image: $p is missing: run make build first" >&2; exit 1; }
done
if grep -q __asan_init "$build/dispatcher/sluice-dispatcher"; then
  echo "make-image: $build is a sanitizer build; give a normal build (make build)" >&2
  exit 1
fi

if command -v podman >/dev/null; then
  builder=(podman build --layers=false)
elif command -v buildah >/dev/null; then
  builder=(buildah bud)
else
  echo "make-image: neither podman nor buildah is installed (scripts/install-deps.sh image)" >&2
  exit 1
fi

# A context of its own, removed at exit: two builds from one build directory
# at once (the integration suite's lanes, tests/integration/suite.py) must
# not empty each other's.
ctx=$(mktemp -d "$build/image.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/root/usr/bin" "$ctx/root/etc" "$ctx/root/bin" "$ctx/root/tmp" "$ctx/workdir"
chmod 1777 "$ctx/root/tmp"
chmod 0700 "$ctx/workdir"

# Copies a file to the same path under the image's root, following links
# (the library's real bytes under the name the loader asks for).
copy_in() {
  local src=$1 dst="$ctx/root$1"
  [[ -e "$dst" ]] && return 0
  mkdir -p "$(dirname "$dst")"
  cp -L "$src" "$dst"
}

# The libraries each binary loads: ldd's "name => /path (addr)" and the
# loader's "/path (addr)" lines; linux-vdso has no file.
libs_of() {
  ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'
}

for p in "${programs[@]}"; do
  install -m 0755 "$p" "$ctx/root/usr/bin/$(basename "$p")"
done
sh=$(readlink -f /bin/sh)
install -m 0755 "$sh" "$ctx/root/bin/sh"
for p in "${programs[@]}" "$sh"; do
  for lib in $(libs_of "$p"); do
    copy_in "$lib"
  done
done
# glibc loads libgcc_s when a thread is cancelled or unwound; cheap to carry.
libc=$(libs_of "$sh" | grep '/libc\.so' | head -1)
gcc_s="$(dirname "$libc")/libgcc_s.so.1"
if [[ -e "$gcc_s" ]]; then copy_in "$gcc_s"; fi

cat > "$ctx/root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/usr/sbin/nologin
sluice:x:10001:10001:sluice:/var/lib/sluice:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
EOF
cat > "$ctx/root/etc/group" <<'EOF'
root:x:0:
sluice:x:10001:
nogroup:x:65534:
EOF
echo 'hosts: files dns' > "$ctx/root/etc/nsswitch.conf"

cat > "$ctx/root/usr/bin/sluice-entrypoint" <<'EOF'
#!/bin/sh
# Runs one Sluice program by name: sluice-dispatcher, sluice-workerd,
# sluice-cat or sluicectl (or dispatcher, workerd, cat, ctl), with the rest of
# the arguments. The program replaces this shell, so it gets the signals.
case "$1" in
  sluice-dispatcher|sluice-workerd|sluice-cat|sluicectl) p=$1 ;;
  dispatcher|workerd|cat) p=sluice-$1 ;;
  ctl) p=sluicectl ;;
  *)
    echo "usage: IMAGE PROGRAM [ARGS...]; PROGRAM is sluice-dispatcher, sluice-workerd, sluice-cat or sluicectl (also dispatcher, workerd, cat, ctl)" >&2
    exit 2 ;;
esac
shift
exec "/usr/bin/$p" "$@"
EOF
chmod 0755 "$ctx/root/usr/bin/sluice-entrypoint"

revision=$(git -C "$root_dir" rev-parse --short HEAD 2>/dev/null || echo unknown)
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$root_dir" log -1 --format=%ct 2>/dev/null || echo 0)}
[[ "$epoch" =~ ^[0-9]+$ ]] || { echo "make-image: SOURCE_DATE_EPOCH=$epoch is not a number of seconds" >&2; exit 1; }
cat > "$ctx/Containerfile" <<EOF
FROM scratch
COPY root/ /
COPY --chown=10001:10001 workdir/ /var/lib/sluice/
ENV PATH=/usr/bin:/bin
USER 10001:10001
WORKDIR /var/lib/sluice
EXPOSE 5050 5051 5060 5061
LABEL org.opencontainers.image.title="sluice" \\
      org.opencontainers.image.version="$version" \\
      org.opencontainers.image.revision="$revision"
ENTRYPOINT ["/usr/bin/sluice-entrypoint"]
CMD ["sluice-dispatcher", "--help"]
EOF

echo "make-image: building $tag with ${builder[*]} ($(du -sh "$ctx/root" | cut -f1) root)"
"${builder[@]}" --quiet --timestamp "$epoch" -t "$tag" -f "$ctx/Containerfile" "$ctx" >/dev/null
echo "make-image: built $tag"
