#!/usr/bin/python3
"""Loopback ports for the benchmarks' local runs (providers, PyTorch references, all-reduce ranks):
a base port with COUNT consecutive ports that are free now, checked by binding each, starting from
a port the kernel hands out (as tests/common/LoopbackPorts.h does for the suite). Fixed or
pid-derived ports collided with other processes on the machine: `bench.run_all_smoke` failed once
when a provider's port (31000 + pid-derived offset, inside the kernel's ephemeral range) was in use
by a test running beside it under ctest -j2. The ports are closed again before returning, so
another process could take one in between; the kernel hands ephemeral ports out in turn, so that
is unlikely, not impossible.

    from loopback_ports import free_port_base; base = free_port_base(4)
    /usr/bin/python3 tools/bench/loopback_ports.py COUNT     # prints the base port
"""
import socket
import sys


def free_port_base(count):
    """A base port with `count` consecutive free loopback ports."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count >= 65535:
            continue
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
