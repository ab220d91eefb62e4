#!/usr/bin/python3
"""Loopback ports for the benchmarks' local runs (providers, PyTorch references, all-reduce ranks):
a base port with COUNT consecutive ports that are free now, checked by binding each, drawn at
random from below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), as
tests/common/LoopbackPorts.h does for the suite. Fixed or pid-derived ports collided with other
processes on the machine: `bench.run_all_smoke` failed once when a provider's port (31000 +
pid-derived offset, inside the kernel's ephemeral range) was in use by a test running beside it
under ctest -j2. Below that range the kernel never hands a port out on its own, so the ports stay
free after they are closed here, unless another process draws the same ones at that moment.

    from loopback_ports import free_port_base; base = free_port_base(4)
    /usr/bin/python3 tools/bench/loopback_ports.py COUNT     # prints the base port
"""
import os
import random
import socket
import sys
import time


def ephemeral_low():
    """The lowest port the kernel hands out on its own."""
    try:
        return int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_base(count):
    """A base port with `count` consecutive free loopback ports."""
    draw = random.Random(os.getpid() ^ time.monotonic_ns())
    top = max(ephemeral_low() - count, 20001)
    for _ in range(1000):
        base = draw.randrange(20000, top)
        ok = True
        for port in range(base, base + count):
            with socket.socket() as t:
                try:
                    t.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise SystemExit(f"loopback_ports: no run of {count} free loopback ports found")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].isdigit() or int(sys.argv[1]) < 1:
        print("usage: loopback_ports.py COUNT (a positive integer)", file=sys.stderr)
        sys.exit(2)
    print(free_port_base(int(sys.argv[1])))
