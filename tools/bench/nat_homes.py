#!/usr/bin/python3
"""tools/bench/nat_bench.py's world: netns_links.py's Topology with 6 sites, of which sites 0..3 are
home routers (SNAT out, only answers in, or a port forward while asked) with a volunteer's home
behind each, site 4 the relay and site 5 the coordinator."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns_links as nl  # noqa: E402  (the namespaces and shaped links: tbf + the TUN delay loop)

HOMES = 4
RELAY_SITE, COORDINATOR_SITE = 4, 5
VOLUNTEER_PORT = 7200


def home_ns(k):
    # named as netem_bench's sites (cnb<PID>n<i>) so that its remove_stale() also removes them
    return nl.ns_name(10 + k)


def home_address(k):
    return f"192.168.{k}.2"


def public(i):
    return nl.address(i)


class HomeWorld(nl.Topology):
    """netem_bench's Topology with 6 sites; sites 0..3 are home routers with a home behind each."""

    def __init__(self):
        super().__init__(COORDINATOR_SITE + 1)
        self.forwarding = False

    def up(self):
        super().up()
        for k in range(HOMES):
            router, home = nl.ns_name(k), home_ns(k)
            nl.run(["ip", "netns", "add", home])
            self.created.append(home)
            nl.run(["ip", "link", "add", "lan", "netns", router, "type", "veth", "peer", "name", "eth0",
                    "netns", home])
            self.nsx(home, "ip", "link", "set", "lo", "up")
            self.nsx(home, "ip", "addr", "add", home_address(k) + "/24", "dev", "eth0")
            self.nsx(home, "ip", "link", "set", "eth0", "up")
            self.nsx(home, "ip", "route", "add", "default", "via", f"192.168.{k}.1")
            self.nsx(router, "ip", "addr", "add", f"192.168.{k}.1/24", "dev", "lan")
            self.nsx(router, "ip", "link", "set", "lan", "up")
            self.nsx(router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            # the home router: out through SNAT; in only the answers to connections from inside
            # and, while forwarded (run (a)), what its port forward sends on
            self.nsx(router, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "e0", "-j", "MASQUERADE")
            self.nsx(router, "iptables", "-A", "FORWARD", "-i", "e0", "-o", "lan", "-m", "conntrack",
                     "--ctstate", "ESTABLISHED,RELATED,DNAT", "-j", "ACCEPT")
            self.nsx(router, "iptables", "-A", "FORWARD", "-i", "e0", "-o", "lan", "-j", "DROP")

    def port_forward(self, on):
        """DNAT of TCP VOLUNTEER_PORT and +1 on each home router's public address to its volunteer."""
        if on == self.forwarding:
            return
        for k in range(HOMES):
            self.nsx(nl.ns_name(k), "iptables", "-t", "nat", "-A" if on else "-D", "PREROUTING", "-i", "e0",
                     "-p", "tcp", "--dport", f"{VOLUNTEER_PORT}:{VOLUNTEER_PORT + 1}", "-j", "DNAT",
                     "--to-destination", home_address(k))
        self.forwarding = on

    def tbf(self, site, rate_mbit):
        """The site's access link at rate_mbit both ways (0: unshaped)."""
        for ns, dev in ((nl.ns_name(site), "e0"), (nl.ROUTER, f"r{site}")):
            if rate_mbit:
                self.nsx(ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit",
                         "burst", "128kb", "limit", "8mb")
            else:
                self.nsx(ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)

    def shape_homes(self, rate, rtt, netem, relay_near):
        shaping = self.shape(rate, rtt, netem)
        self.tbf(COORDINATOR_SITE, 0)
        if netem:
            self.nsx(nl.ns_name(COORDINATOR_SITE), "tc", "qdisc", "replace", "dev", "e0", "root", "netem",
                     "delay", f"{rtt / 4}ms")
            self.nsx(nl.ROUTER, "tc", "qdisc", "replace", "dev", f"r{COORDINATOR_SITE}", "root", "netem",
                     "delay", f"{rtt / 4}ms")
        if relay_near:
            if netem:
                raise SystemExit("nat_bench: --relay-near is only built for the TUN delay loop")
            self.nsx(nl.ROUTER, "ip", "rule", "del", "iif", f"r{RELAY_SITE}", "lookup", "100", "pref", "100")
        return shaping

    def relay_link(self, rate_mbit, netem, rtt):
        if netem and rate_mbit:
            for ns, dev in ((nl.ns_name(RELAY_SITE), "e0"), (nl.ROUTER, f"r{RELAY_SITE}")):
                self.nsx(ns, "tc", "qdisc", "replace", "dev", dev, "root", "netem", "delay", f"{rtt / 4}ms",
                         "rate", f"{rate_mbit}mbit", "limit", "100000")
        else:
            self.tbf(RELAY_SITE, rate_mbit)
