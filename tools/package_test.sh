#!/usr/bin/env bash
# The volunteer's install, end to end, as on a fresh Debian 12 machine (issue [O]; on demand, not
# in CI: it downloads ~300 MB from the Debian archive the first time):
#   1. builds the packages (cmake --build BUILD --target package);
#   2. makes a minimal Debian 12 root with debootstrap (kept in BUILD/debootstrap-bookworm and
#      copied for each run, so later runs download only what the package needs);
#   3. installs cairn-provider_*.deb there with `apt-get install ./…`, so apt resolves the
#      dependencies dpkg-shlibdeps wrote: a missing one fails here;
#   4. runs a coordinator outside that root (BUILD's clusterize --serve on 127.0.0.1, the example
#      CNN, Fashion-MNIST served as safetensors shards) and two volunteers inside it (chroot:
#      the root's own files and libraries, the host's loopback), one 2-stage cluster;
#   5. checks that the run trained and that PyTorch evaluates the merged model to the Leaf's
#      accuracy.
#   sudo tools/package_test.sh [BUILD_DIR]     (root: debootstrap and chroot need it)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$(cd "${1:-build}" && pwd)
[[ $(id -u) -eq 0 ]] || { echo "package_test: run as root (debootstrap, chroot)" >&2; exit 2; }
command -v debootstrap > /dev/null || { echo "package_test: needs debootstrap (apt-get install debootstrap)" >&2; exit 2; }
MIRROR=${CAIRN_DEBIAN_MIRROR:-http://deb.debian.org/debian}

echo "package_test: building the packages"
cmake --build "$BUILD" --target package > "$BUILD/package_test_cpack.log" 2>&1 ||
  { cat "$BUILD/package_test_cpack.log"; exit 1; }
debs=("$BUILD"/cairn-provider_*_"$(dpkg --print-architecture)".deb)
[[ -f "${debs[0]}" ]] || { echo "package_test: no cairn-provider .deb in $BUILD" >&2; exit 1; }
# The newest (the names are ours: no odd characters).
# shellcheck disable=SC2012
deb=$(ls -t "${debs[@]}" | head -1)

base=$BUILD/debootstrap-bookworm
if [[ ! -f "$base/.cairn-complete" ]]; then
  echo "package_test: debootstrap --variant=minbase bookworm $base ($MIRROR)"
  rm -rf "$base"
  debootstrap --variant=minbase bookworm "$base" "$MIRROR" > "$BUILD/package_test_debootstrap.log" 2>&1 ||
    { tail -20 "$BUILD/package_test_debootstrap.log"; exit 1; }
  touch "$base/.cairn-complete"
fi

root=$(mktemp -d /tmp/cairn-root.XXXXXX)
work=$(mktemp -d /tmp/cairn-package-test.XXXXXX)
cleanup() {
  umount "$root/proc" "$root/sys" "$root/dev" 2> /dev/null || true
  rm -rf "$root" "$work"
}
trap cleanup EXIT
cp -a "$base/." "$root/"
# A machine's /proc, /sys and /dev (hwloc reads the topology and memory from /sys).
mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys"
mount --bind /dev "$root/dev"
cp /etc/resolv.conf "$root/etc/resolv.conf"
cp "$deb" "$root/tmp/"
echo "package_test: apt-get install ./$(basename "$deb") in a fresh Debian 12 root ($root)"
chroot "$root" apt-get update -qq
chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  "/tmp/$(basename "$deb")" > "$work/apt.log" 2>&1 || { tail -30 "$work/apt.log"; exit 1; }
chroot "$root" dpkg-query -W libopenblas0-pthread > /dev/null ||
  { echo "package_test: apt did not install libopenblas0-pthread (Depends)" >&2; exit 1; }
# (dpkg-query's own ${...} format, not the shell's)
# shellcheck disable=SC2016
echo "package_test: installed: $(chroot "$root" dpkg-query -W -f='${Package} ${Version}' cairn-provider)," \
  "$(chroot "$root" dpkg-query -W -f='${binary:Package}\n' | wc -l) packages in the root"
chroot "$root" cairn-provider --help > /dev/null
[[ ! -e "$root$BUILD" ]] || { echo "package_test: the root holds the build folder?" >&2; exit 1; }

OPENBLAS_NUM_THREADS=1 /usr/bin/python3 - "$BUILD" "$root" "$work" <<'PY'
import json, os, sys, time
build, root, work = sys.argv[1:4]
sys.path.insert(0, os.path.join(os.getcwd(), "tests", "integration"))
import volunteer_harness as vt  # Process, ports, the coordinator, evaluation
import served_chunks_test as sc  # safetensors shards of Fashion-MNIST

model = vt.make_model(work)
sc.make_shards(os.path.join(work, "data"))
sc.make_shards(os.path.join(work, "test"), prefix="test", idx="t10k", shards=sc.TEST_SHARDS,
               per_shard=sc.PER_TEST_SHARD)
job = sc.write_job(work, "job.json", model, {"format": "safetensors", "source": "coordinator",
                                             "location": os.path.join(work, "data"),
                                             "test_location": os.path.join(work, "test")})
args = type("Args", (), {"clusterize": os.path.join(build, "clusterize", "clusterize"), "work": work})()
out = os.path.join(work, "coordinator")
coordinator, invite = vt.start_coordinator(args, job, model, out, ["--min-volunteers", "2", "--clusters", "1"])
volunteers = []
try:
    for i, port in enumerate(vt.free_ports(2)):
        # Inside the root: its cairn-provider, its libraries, its /var/lib; the host's loopback.
        # The volunteer's own limits as the service passes them: a cap on what it sends.
        cmd = ["chroot", root, "cairn-provider", "--join", invite, "--listen", f"127.0.0.1:{port}",
               "--workdir", f"/var/lib/cairn/volunteer_{i}", "--probe-megabytes", "1",
               "--max-mbps", "400", "--cores", "1"]
        volunteers.append((vt.Process(f"volunteer {i} (packaged)", cmd), None))
    # A volunteer that fails ends the test at once; the coordinator has 600 s to end the run.
    deadline = time.monotonic() + 600
    while coordinator.proc.poll() is None and time.monotonic() < deadline:
        failed = [(v.tag, v.proc.poll()) for v, _ in volunteers if v.proc.poll() not in (None, 0)]
        if failed:
            vt.fail(f"packaged volunteers exited: {failed}")
        time.sleep(0.5)  # polling processes this script started; no ordering is assumed
    if coordinator.proc.poll() is None:
        vt.fail("the coordinator did not end the run within 600 s")
    vt.all_finish(coordinator, volunteers)
finally:
    vt.kill_all(coordinator, volunteers)
test_samples = sc.TEST_SHARDS * sc.PER_TEST_SHARD
reported = vt.check_trained(out, test_samples, "package_test: the packaged volunteers' Leaf reported "
                            "{reported:.4f}; PyTorch evaluates the merged model to {accuracy:.4f}")
print(f"package_test: ok: {json.load(open(os.path.join(out, 'run_result.json')))['clusters'][0].get('steps')} steps")
PY
