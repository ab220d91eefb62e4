"""A closed world of network namespaces with real NAT, for volunteers behind home routers
(docs/OPERATIONS.md "Behind a home router"); shared by tests/integration/nat_test.py and the demo
examples/fashion_mnist/run_nat.py. It never touches this machine's own interfaces:

- an "internet" namespace (`inet`) holds a bridge carrying the given public addresses
  (10.77.0.0/24: the coordinator's, reachable volunteers');
- each home k is a namespace (`home_of(k)`, 192.168.k.2) behind a router namespace whose only way
  out is `iptables -t nat ... MASQUERADE` on its WAN side (10.77.0.10+k): SNAT with connection
  tracking, the return traffic of its own connections forwarded, nothing else (no route reaches
  the home's 192.168.k.0/24 from outside).

Needs root, `ip` (iproute2) and `iptables`: skip_reason() says why not, before anything is made.
close() removes every namespace made; callers register it with atexit and signal handlers.
"""
import os
import shutil
import subprocess

SUBNET = "10.77.0"


def sh(*cmd):
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")


def router_address(k):
    """Home k's router's WAN address: where the coordinator sees home k's volunteer come from."""
    return f"{SUBNET}.{10 + k}"


class NatWorld:
    """The namespaces above; close() removes them all. `prefix`: the start of their names (the
    process id follows, so two runs side by side do not collide)."""

    def __init__(self, prefix="cnat"):
        self.tag = f"{prefix}{os.getpid() % 1000000}"
        self.inet = self.tag + "i"
        self.made = []

    def skip_reason(self):
        if os.geteuid() != 0:
            return "not root: network namespaces need it"
        for tool in ("ip", "iptables"):
            if shutil.which(tool) is None:
                return f"no `{tool}` (Debian package {'iproute2' if tool == 'ip' else 'iptables'})"
        probe = self.tag + "p"
        made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
        if made.returncode != 0:
            return f"`ip netns add` failed: {made.stderr.strip()}"
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
        return None

    def namespace(self, name):
        sh("ip", "netns", "add", name)
        self.made.append(name)
        sh("ip", "-n", name, "link", "set", "lo", "up")

    def build(self, public, homes):
        """The internet with the addresses `public` (e.g. the coordinator's and reachable
        volunteers', each SUBNET.x with x < 10) on its bridge, and `homes` homes behind routers."""
        self.namespace(self.inet)
        sh("ip", "-n", self.inet, "link", "add", "bridge0", "type", "bridge")
        for host in public:
            sh("ip", "-n", self.inet, "addr", "add", host + "/24", "dev", "bridge0")
        sh("ip", "-n", self.inet, "link", "set", "bridge0", "up")
        for k in range(homes):
            self.home(k)

    def home(self, k):
        router, home = f"{self.tag}r{k}", self.home_of(k)
        self.namespace(router)
        self.namespace(home)
        sh("ip", "-n", self.inet, "link", "add", f"w{k}", "type", "veth", "peer", "name", "wan", "netns", router)
        sh("ip", "-n", self.inet, "link", "set", f"w{k}", "master", "bridge0", "up")
        sh("ip", "-n", router, "addr", "add", f"{router_address(k)}/24", "dev", "wan")
        sh("ip", "-n", router, "link", "set", "wan", "up")
        sh("ip", "-n", router, "link", "add", "lan", "type", "veth", "peer", "name", "eth0", "netns", home)
        sh("ip", "-n", router, "addr", "add", f"192.168.{k}.1/24", "dev", "lan")
        sh("ip", "-n", router, "link", "set", "lan", "up")
        sh("ip", "-n", home, "addr", "add", f"192.168.{k}.2/24", "dev", "eth0")
        sh("ip", "-n", home, "link", "set", "eth0", "up")
        sh("ip", "-n", home, "route", "add", "default", "via", f"192.168.{k}.1")
        # The home router: out through SNAT; in only what answers a connection from inside.
        inside = ["ip", "netns", "exec", router]
        sh(*inside, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        sh(*inside, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "wan", "-j", "MASQUERADE")
        sh(*inside, "iptables", "-A", "FORWARD", "-i", "wan", "-o", "lan", "-m", "conntrack",
           "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
        sh(*inside, "iptables", "-A", "FORWARD", "-i", "wan", "-o", "lan", "-j", "DROP")

    def run_in(self, name):
        return ["ip", "netns", "exec", name]

    def home_of(self, k):
        return f"{self.tag}h{k}"

    def close(self):
        for name in reversed(self.made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.made = []
