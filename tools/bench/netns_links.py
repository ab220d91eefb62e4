#!/usr/bin/python3
"""Network namespaces for the link benchmarks (tools/bench/netem_bench.py, nat_bench.py): n process
namespaces (cnb<PID>n<i>, 10.77.<i>.2 on e0) joined by veth pairs to one router namespace
(cnb<PID>r, 10.77.<i>.1 on r<i>), links shaped with netem or, where the kernel has none, tbf plus
the delay relay below (this script, --relay-tun, run inside the router namespace); preflight says
why namespaces cannot be made, remove_stale removes those of a SIGKILLed run. netem_bench.py's
header says how the shaping works. No traffic leaves these namespaces.
"""
import argparse
import collections
import fcntl
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import time

PY = "/usr/bin/python3"
TAG = f"cnb{os.getpid()}"
ROUTER = TAG + "r"


def log(msg):
    print("netns_links: " + msg, file=sys.stderr, flush=True)


def run(cmd, check=True, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}: {proc.stderr.strip()[:400]}")
    return proc


# ---- the delay relay (runs inside the router namespace) ------------------------------------------

def relay(tun_name, delay_s):
    """Reads every packet routed into TUN `tun_name`, writes it back after `delay_s` (FIFO: one
    fixed delay keeps the order)."""
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, 0x400454CA, struct.pack("16sH", tun_name.encode(), 0x0001 | 0x1000))  # TUNSETIFF, IFF_TUN|IFF_NO_PI
    os.set_blocking(fd, False)
    print("ready", flush=True)
    queue = collections.deque()
    while True:
        now = time.monotonic()
        timeout = max(0.0, queue[0][0] - now) if queue else 1.0
        readable, _, _ = select.select([fd], [], [], timeout)
        if readable:
            for _ in range(512):
                try:
                    packet = os.read(fd, 65536)
                except BlockingIOError:
                    break
                queue.append((time.monotonic() + delay_s, packet))
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            try:
                os.write(fd, queue.popleft()[1])
            except OSError:
                pass


# ---- topology ------------------------------------------------------------------------------------

def ns_name(i):
    return f"{TAG}n{i}"


def address(i):
    return f"10.77.{i}.2"


class Topology:
    """n process namespaces and a router namespace; shape(rate_mbit, rtt_ms) or unshaped."""

    def __init__(self, n):
        self.n, self.relay, self.created = n, None, []
        self.children = []

    def nsx(self, ns, *cmd, check=True):
        return run(["ip", "netns", "exec", ns] + list(cmd), check=check)

    def up(self):
        run(["ip", "netns", "add", ROUTER])
        self.created.append(ROUTER)
        self.nsx(ROUTER, "ip", "link", "set", "lo", "up")
        self.nsx(ROUTER, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        self.nsx(ROUTER, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0")
        self.nsx(ROUTER, "sysctl", "-qw", "net.ipv4.conf.default.rp_filter=0")
        for i in range(self.n):
            ns = ns_name(i)
            run(["ip", "netns", "add", ns])
            self.created.append(ns)
            run(["ip", "link", "add", "e0", "netns", ns, "type", "veth", "peer", "name", f"r{i}",
                 "netns", ROUTER])
            self.nsx(ns, "ip", "link", "set", "lo", "up")
            self.nsx(ns, "ip", "addr", "add", address(i) + "/24", "dev", "e0")
            self.nsx(ns, "ip", "link", "set", "e0", "up")
            self.nsx(ns, "ip", "route", "add", "default", "via", f"10.77.{i}.1")
            self.nsx(ROUTER, "ip", "addr", "add", f"10.77.{i}.1/24", "dev", f"r{i}")
            self.nsx(ROUTER, "ip", "link", "set", f"r{i}", "up")

    def netem_available(self):
        p = self.nsx(ns_name(0), "tc", "qdisc", "replace", "dev", "e0", "root", "netem", "delay", "1ms",
                     check=False)
        if p.returncode == 0:
            self.nsx(ns_name(0), "tc", "qdisc", "del", "dev", "e0", "root", check=False)
            return True, ""
        return False, p.stderr.strip()

    def unshape(self):
        if self.relay:
            self.stop_relay()
        for i in range(self.n):
            self.nsx(ns_name(i), "tc", "qdisc", "del", "dev", "e0", "root", check=False)
            self.nsx(ROUTER, "tc", "qdisc", "del", "dev", f"r{i}", "root", check=False)

    def shape(self, rate_mbit, rtt_ms, use_netem):
        self.unshape()
        ends = [(ns_name(i), "e0") for i in range(self.n)] + [(ROUTER, f"r{i}") for i in range(self.n)]
        if use_netem:
            for ns, dev in ends:
                self.nsx(ns, "tc", "qdisc", "replace", "dev", dev, "root", "netem", "delay",
                         f"{rtt_ms / 4}ms", "rate", f"{rate_mbit}mbit", "limit", "100000")
            return "netem"
        for ns, dev in ends:
            self.nsx(ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit",
                     "burst", "128kb", "limit", "8mb")
        if rtt_ms > 0:
            self.start_relay(rtt_ms / 2000.0)
        return "tbf+tun-relay"

    def start_relay(self, delay_s):
        tun = "cnbtun"
        self.relay = subprocess.Popen(["ip", "netns", "exec", ROUTER, PY, os.path.abspath(__file__),
                                       "--relay-tun", tun, "--relay-delay-s", str(delay_s)],
                                      stdout=subprocess.PIPE, text=True, start_new_session=True)
        if self.relay.stdout.readline().strip() != "ready":
            raise RuntimeError("the delay relay did not start")
        self.nsx(ROUTER, "ip", "link", "set", tun, "txqueuelen", "20000")
        self.nsx(ROUTER, "ip", "link", "set", tun, "up")
        self.nsx(ROUTER, "sysctl", "-qw", f"net.ipv4.conf.{tun}.rp_filter=0")
        self.nsx(ROUTER, "ip", "route", "add", "default", "dev", tun, "table", "100")
        for i in range(self.n):
            self.nsx(ROUTER, "ip", "rule", "add", "iif", f"r{i}", "lookup", "100", "pref", "100")

    def stop_relay(self):
        for i in range(self.n):
            self.nsx(ROUTER, "ip", "rule", "del", "iif", f"r{i}", "lookup", "100", "pref", "100", check=False)
        self.nsx(ROUTER, "ip", "route", "flush", "table", "100", check=False)
        kill_group(self.relay)
        self.relay = None

    def measure(self, server_code, client_code):
        """Runs python `server_code` in namespace 1 (it prints a line once it listens), then
        `client_code` in namespace 0, and returns the number the client prints."""
        server = subprocess.Popen(["ip", "netns", "exec", ns_name(1), PY, "-c", server_code],
                                  stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            server.stdout.readline()
            return float(self.nsx(ns_name(0), PY, "-c", client_code).stdout.strip())
        finally:
            kill_group(server)

    def rtt_ms(self):
        """Round trip measured as the time of a TCP connect from namespace 0 to namespace 1."""
        return self.measure(
            "import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
            f"s.bind(('{address(1)}',7999));s.listen(8);print('up',flush=True)\n"
            "while True: s.accept()[0].close()",
            "import socket,time,statistics\nr=[]\nfor _ in range(5):\n t=time.perf_counter();"
            f"c=socket.create_connection(('{address(1)}',7999),timeout=5);r.append(time.perf_counter()-t);c.close()\n"
            "print(statistics.median(r)*1000)")

    def throughput_mbit(self, megabytes=4):
        """Bulk TCP rate from namespace 0 to namespace 1 (one connection, `megabytes` MB, timed from
        connect to the receiver's acknowledgement of the last byte)."""
        return self.measure(
            "import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
            f"s.bind(('{address(1)}',7998));s.listen(1);print('up',flush=True);c=s.accept()[0];n=0\n"
            f"while n<{megabytes << 20}:\n b=c.recv(1<<20)\n if not b: break\n n+=len(b)\n"
            "c.sendall(b'k');c.close()",
            "import socket,time\nt=time.perf_counter()\n"
            f"c=socket.create_connection(('{address(1)}',7998),timeout=60)\n"
            f"c.sendall(bytes({megabytes << 20}));c.recv(1)\n"
            f"print({megabytes * 8 * 1.048576}/(time.perf_counter()-t))")

    def down(self):
        for p in self.children:
            kill_group(p)
        if self.relay:
            kill_group(self.relay)
        for ns in reversed(self.created):
            pids = run(["ip", "netns", "pids", ns], check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
            run(["ip", "netns", "del", ns], check=False)
        self.created = []


def kill_group(proc):
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()


def preflight():
    if os.geteuid() != 0:
        return "not root (network namespaces and tc need CAP_NET_ADMIN)"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "`ip` or `tc` (iproute2) not found"
    probe = f"{TAG}probe"
    p = run(["ip", "netns", "add", probe], check=False)
    if p.returncode != 0:
        return "cannot create a network namespace: " + p.stderr.strip()
    run(["ip", "netns", "del", probe], check=False)
    return None


def remove_stale():
    """Namespaces of an earlier run of this script that was SIGKILLed (cnb<PID>..., PID gone)."""
    import re
    for line in run(["ip", "netns", "list"], check=False).stdout.splitlines():
        m = re.match(r"(cnb(\d+)(?:r|n\d+))\b", line.strip())
        if m and int(m.group(2)) != os.getpid() and not os.path.exists(f"/proc/{m.group(2)}"):
            log(f"removing namespace {m.group(1)} left by a killed run")
            for pid in run(["ip", "netns", "pids", m.group(1)], check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
            run(["ip", "netns", "del", m.group(1)], check=False)


if __name__ == "__main__":
    # The delay relay: Topology.start_relay runs this inside the router namespace.
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--relay-tun", required=True)
    p.add_argument("--relay-delay-s", type=float, required=True)
    a = p.parse_args()
    relay(a.relay_tun, a.relay_delay_s)
