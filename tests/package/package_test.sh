#!/usr/bin/env bash
# ctest package.debs: the Debian packages a volunteer and a researcher install (issue [O];
# cmake/Packaging.cmake, docs/OPERATIONS.md "Running as a service"), built with CPack from this
# build and checked as a user's machine would take them:
#   * both .deb files are made; their contents are exactly the expected files (nothing of the
#     build tree, no other path);
#   * their Depends come from dpkg-shlibdeps (libtorch, libzmq5 among them) and each binary has
#     no RPATH/RUNPATH and names no library outside the system's;
#   * lintian reports no error (warnings are printed, not fatal);
#   * the service unit passes `systemd-analyze verify` against the unpacked package;
#   * unpacked with `dpkg -x` into an empty folder (no build folder on the path), cairn-provider
#     --help and --probe, cairn-clusterize --help and cairn-keys run; --config reads flags from a
#     file and refuses a key no flag has (exit 2, naming the file and the key); --join @FILE
#     reads the invite from a file and refuses a missing one (exit 2 naming it);
#   * cairn-volunteer add writes the invite 0600, the flags the provider then reads and the
#     limits' systemd drop-in (CPUQuota, MemoryMax), refuses a cut-off invite, and remove deletes
#     all three.
#   tests/package/package_test.sh BUILD_DIR
set -euo pipefail
BUILD=$(cd "$1" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "package_test: FAIL: $*" >&2; exit 1; }

version=$(sed -nE 's/^set\(CPACK_PACKAGE_VERSION "([^"]+)"\)$/\1/p' "$BUILD/CPackConfig.cmake")
[[ -n "$version" ]] || fail "no CPACK_PACKAGE_VERSION in $BUILD/CPackConfig.cmake"
arch=$(dpkg --print-architecture)
(cd "$BUILD" && cpack -G DEB -B "$work/out" > "$work/cpack.log" 2>&1) || { cat "$work/cpack.log"; fail "cpack"; }
provider_deb=$work/out/cairn-provider_${version}_${arch}.deb
coordinator_deb=$work/out/cairn-coordinator_${version}_${arch}.deb
for deb in "$provider_deb" "$coordinator_deb"; do
  [[ -f "$deb" ]] || { ls -l "$work/out"; fail "cpack made no $(basename "$deb")"; }
done

# Contents: every file of each package, exactly (folders left out).
contents() { dpkg-deb --contents "$1" | awk '$1 !~ /^d/ {print $6}' | sed 's#^\./#/#' | sort; }
expect_provider="/usr/lib/systemd/system/cairn-provider@.service
/usr/bin/cairn-provider
/usr/sbin/cairn-volunteer
/usr/share/doc/cairn-provider/OPERATIONS.md
/usr/share/doc/cairn-provider/changelog.gz
/usr/share/doc/cairn-provider/copyright
/usr/share/man/man1/cairn-provider.1.gz
/usr/share/man/man1/cairn-volunteer.1.gz"
expect_coordinator="/usr/bin/cairn-clusterize
/usr/bin/cairn-keys
/usr/share/doc/cairn-coordinator/changelog.gz
/usr/share/doc/cairn-coordinator/copyright
/usr/share/man/man1/cairn-clusterize.1.gz
/usr/share/man/man1/cairn-keys.1.gz"
got=$(contents "$provider_deb")
[[ "$got" == "$(sort <<<"$expect_provider")" ]] || fail "cairn-provider holds:
$got
expected:
$expect_provider"
got=$(contents "$coordinator_deb")
[[ "$got" == "$(sort <<<"$expect_coordinator")" ]] || fail "cairn-coordinator holds:
$got
expected:
$expect_coordinator"

# Depends from dpkg-shlibdeps: the libraries the binaries link, as Debian packages.
for deb in "$provider_deb" "$coordinator_deb"; do
  depends=$(dpkg-deb -f "$deb" Depends)
  for lib in libtorch libzmq5 libc6 libopenblas0-pthread; do
    grep -q "$lib" <<<"$depends" || fail "$(basename "$deb") Depends lacks $lib: $depends"
  done
done

# The description: a synopsis line, then the extended text (no CMake list separators in it).
for deb in "$provider_deb" "$coordinator_deb"; do
  description=$(dpkg-deb -f "$deb" Description)
  if grep -qE '^ ?;' <<<"$description"; then fail "$(basename "$deb") Description: $description"; fi
  [[ $(wc -l <<<"$description") -ge 3 ]] || fail "$(basename "$deb") has no extended description"
done

# Unpacked as a user gets them, in a folder that has never seen the build.
root=$work/root
dpkg -x "$provider_deb" "$root"
dpkg -x "$coordinator_deb" "$root"
for bin in "$root"/usr/bin/*; do
  if readelf -d "$bin" | grep -Eq 'RPATH|RUNPATH'; then fail "$bin has an RPATH: $(readelf -d "$bin" | grep -E 'RPATH|RUNPATH')"; fi
  if strings "$bin" | grep -Fq "$BUILD"; then fail "$bin names the build folder $BUILD"; fi
done
if grep -rqF "$BUILD" "$root"/usr/share/man; then fail "a man page names the build folder $BUILD"; fi
zcat "$root"/usr/share/man/man1/cairn-provider.1.gz | grep -qF -- '\-\-join' || fail "the man page of cairn-provider lacks --join"

# lintian: no errors (E:); its warnings and notes are printed for whoever reads the log.
lintian_out=$(lintian --tag-display-limit 0 "$provider_deb" "$coordinator_deb" 2>&1 || true)
lintian_out=$(grep -v 'running with root privileges is not recommended' <<<"$lintian_out" || true)
[[ -z "$lintian_out" ]] || echo "lintian says:"$'\n'"$lintian_out"
if grep -q '^E:' <<<"$lintian_out"; then fail "lintian reports errors (above)"; fi

# The service unit: systemd-analyze verify (syntax, directives, specifiers) on an instance of it
# whose ExecStart names the unpacked binary (verify checks that it exists and is executable;
# this machine has no /usr/bin/cairn-provider).
unit="$root/usr/lib/systemd/system/cairn-provider@.service"
mkdir "$work/units"
sed "s#/usr/bin/cairn-provider #$root/usr/bin/cairn-provider #" "$unit" > "$work/units/cairn-provider@test.service"
grep -qF "$root/usr/bin/cairn-provider --config" "$work/units/cairn-provider@test.service" || fail "the unit's ExecStart"
if ! out=$(SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --man=no "$work/units/cairn-provider@test.service" 2>&1); then
  echo "$out"; fail "systemd-analyze verify $unit"
fi
if grep -q 'cairn-provider' <<<"$out"; then echo "$out"; fail "systemd-analyze verify complains about the unit"; fi

export PATH="$root/usr/bin:$root/usr/sbin:/usr/bin:/bin"
cd "$work"
# (Each output whole before grep reads it: grep -q leaving early would kill the writer.)
help=$(cairn-provider --help) || fail "cairn-provider --help"
grep -q -- '--join' <<<"$help" || fail "cairn-provider --help lacks --join"
help=$(cairn-clusterize --help) || fail "cairn-clusterize --help"
grep -q -- '--serve' <<<"$help" || fail "cairn-clusterize --help lacks --serve"
cairn-keys --help > /dev/null || fail "cairn-keys --help"
cairn-provider --probe --probe-megabytes 4 --address 127.0.0.1:5999 > probe.json 2> probe.err ||
  { cat probe.err; fail "cairn-provider --probe"; }
grep -q '"IP": "127.0.0.1:5999"' probe.json || { cat probe.json; fail "--probe wrote no entry"; }

# expect_exit CODE TEXT COMMAND...: the command exits CODE and its stderr holds TEXT.
expect_exit() {
  local code=$1 text=$2 rc=0
  shift 2
  "$@" > out.txt 2> err.txt || rc=$?
  [[ $rc -eq $code ]] || { cat err.txt; fail "$* exited $rc, expected $code"; }
  grep -qF -- "$text" err.txt || { cat err.txt; fail "$*: stderr lacks \"$text\""; }
}
# --config: flags from a file; a key no flag has is refused, naming the file and the key.
printf '# a probe address from the file\naddress = "127.0.0.1:6001"\nprobe-megabytes = 4\n' > probe.conf
cairn-provider --config probe.conf --probe > probe2.json 2> /dev/null || fail "--probe with --config"
grep -q '"IP": "127.0.0.1:6001"' probe2.json || { cat probe2.json; fail "--config's address was not used"; }
printf 'listen = "127.0.0.1:7100"\ncolour = 4\n' > bad.conf
expect_exit 2 "--config bad.conf" cairn-provider --config bad.conf --probe
expect_exit 2 "colour" cairn-provider --config bad.conf --probe
expect_exit 2 "missing.conf" cairn-provider --config missing.conf --probe
# --join @FILE: the invite from a file (a missing file or an empty one: exit 2 naming it).
expect_exit 2 "cannot read $work/none.invite" cairn-provider --join "@$work/none.invite" --listen 127.0.0.1:7100
: > empty.invite
expect_exit 2 "holds no invite" cairn-provider --join @empty.invite --listen 127.0.0.1:7100
echo "cairn-invite:1:127.0.0.1:1:zz:00" > broken.invite
expect_exit 2 "has a coordinator key that is not 80 hex digits" cairn-provider --join @broken.invite --listen 127.0.0.1:7100

# cairn-volunteer: what it writes is what the service reads.
export CAIRN_VOLUNTEER_DIR=$work/volunteer.d CAIRN_SYSTEMD_DIR=$work/systemd
key=$(printf 'ab%.0s' $(seq 40)); token=$(printf 'cd%.0s' $(seq 16))
invite="cairn-invite:1:coord.example:7000:$key:$token"
cairn-volunteer add "$invite" --listen 0.0.0.0:7100 --advertise 192.0.2.7:7100 --cores 1 --memory-gb 2 \
  --active-hours 22:00-07:00 --max-mbps 20 > add.txt
grep -qx 'active-hours = "22:00-07:00"' "$CAIRN_VOLUNTEER_DIR/coord.example-7000.conf" || fail "the .conf's active-hours"
grep -qx 'max-mbps = 20' "$CAIRN_VOLUNTEER_DIR/coord.example-7000.conf" || fail "the .conf's max-mbps"
[[ "$(stat -c %a "$CAIRN_VOLUNTEER_DIR/coord.example-7000.invite")" == 600 ]] || fail "the invite file is not 0600"
[[ "$(cat "$CAIRN_VOLUNTEER_DIR/coord.example-7000.invite")" == "$invite" ]] || fail "the invite file"
grep -q 'systemctl enable --now cairn-provider@coord.example-7000' add.txt || { cat add.txt; fail "add's next step"; }
limits="$CAIRN_SYSTEMD_DIR/cairn-provider@coord.example-7000.service.d/limits.conf"
[[ "$(grep -v '^#' "$limits")" == $'[Service]\nCPUQuota=100%\nMemoryMax=2560M' ]] || { cat "$limits"; fail "the limits' drop-in"; }
# The provider reads both: the .conf's flags (listen, advertise, cores, memory-gb, active-hours: all parse, and
# without --join --listen is refused: it came from the file), the invite file (this test's made-up key is refused by name, before any network).
expect_exit 2 "--listen is for --join" cairn-provider --config "$CAIRN_VOLUNTEER_DIR/coord.example-7000.conf" --probe
expect_exit 2 "has a coordinator key that is not a CURVE public key" cairn-provider \
  --config "$CAIRN_VOLUNTEER_DIR/coord.example-7000.conf" --join "@$CAIRN_VOLUNTEER_DIR/coord.example-7000.invite"
expect_exit 2 "does not look like cairn-invite" cairn-volunteer add "${invite%??}" --listen 127.0.0.1:7100 --name cut
[[ ! -e "$CAIRN_VOLUNTEER_DIR/cut.invite" ]] || fail "a refused invite was written"
expect_exit 2 "binds every interface" cairn-volunteer add "$invite" --listen 0.0.0.0:7100 --name open
expect_exit 2 "is not HH:MM-HH:MM" cairn-volunteer add "$invite" --listen 127.0.0.1:7100 --name late --active-hours 22-07
expect_exit 2 "--active-hours \"24:00-07:00\"" cairn-provider --join "$invite" --listen 127.0.0.1:7100 --active-hours 24:00-07:00
expect_exit 2 "leaves nothing of --max-mbps 10" cairn-provider --join "$invite" --listen 127.0.0.1:7100 --max-mbps 10 --upload-mbps 10
cairn-volunteer remove coord.example-7000 > /dev/null
[[ -z "$(ls "$CAIRN_VOLUNTEER_DIR")" ]] || fail "remove left $(ls "$CAIRN_VOLUNTEER_DIR")"
[[ -z "$(ls "$CAIRN_SYSTEMD_DIR")" ]] || fail "remove left $(ls -R "$CAIRN_SYSTEMD_DIR")"
echo "package_test: ok: $(basename "$provider_deb") and $(basename "$coordinator_deb")"
