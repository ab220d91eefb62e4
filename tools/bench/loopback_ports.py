#!/usr/bin/python3
"""Loopback ports for local runs (the python tests' volunteers and coordinators, the benchmarks'
providers, PyTorch references and all-reduce ranks), shared out the way tests/common/LoopbackPorts.h
shares them among the C++ tests, through the same claim files, so every test and benchmark on the
machine takes part in one scheme.

The ports lie below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range): the
kernel never hands those out on its own, so a port stays free while the process using it is down
(a restarted coordinator, a volunteer between runs). Processes share them out in blocks of 64: a
process claims a block by writing its pid and the pid's start time into
/tmp/cairn-loopback-ports/block-K under an flock, and the block is its own until that process is
gone. Each port of a block is handed out once, checked by binding it; free_ports hands out every
other one and keeps the one above it free too (a volunteer on --listen's port P takes P + 1).
Ports drawn at random one by one (as before) let two tests collide: CI once saw a restarted
coordinator fail with "Address already in use", a test beside it having drawn its port while it
was down.

    from loopback_ports import free_ports, free_port_base
    free_ports(3)            # three ports, held for this process's life
    free_port_base(4)        # a base port with 4 consecutive ports
    /usr/bin/python3 tools/bench/loopback_ports.py COUNT   # prints a base port, held for the caller's life

No library here does this; it is written by hand.
"""
import fcntl
import os
import random
import socket
import sys
import threading

BLOCK = 64
LOWEST = 20000
CLAIMS = "/tmp/cairn-loopback-ports"


def ephemeral_low():
    """The lowest port the kernel hands out on its own."""
    try:
        low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
    return low if low > LOWEST + BLOCK else 32768


def _identity(pid):
    """'<pid> <start time>' of a live process, '' when it is gone (the start time tells a reused
    pid from the claimant)."""
    try:
        line = open(f"/proc/{pid}/stat").read()
    except OSError:
        return ""
    fields = line[line.rfind(")") + 1:].split()
    return f"{pid} {fields[19]}" if len(fields) > 19 else ""


def _binds(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _claim(k, pid):
    """Claims block k for process pid if no live process holds it."""
    try:
        os.mkdir(CLAIMS, 0o1777)
        os.chmod(CLAIMS, 0o1777)  # the umask aside: every user's tests share it
    except OSError:
        pass  # there already (or not to be made: the open below then fails, as in LoopbackPorts.h)
    try:
        fd = os.open(f"{CLAIMS}/block-{k}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError:
        return False  # another user's file: not ours to take
    try:
        try:
            os.fchmod(fd, 0o666)
        except OSError:
            pass
        fcntl.flock(fd, fcntl.LOCK_EX)  # held only for this read and write
        owner = os.pread(fd, 64, 0).decode(errors="replace").split()
        if len(owner) == 2 and owner[0].isdigit() and _identity(int(owner[0])) == " ".join(owner):
            return False
        me = (_identity(pid) + "\n").encode()
        os.ftruncate(fd, 0)
        return os.pwrite(fd, me, 0) == len(me)
    finally:
        os.close(fd)  # also lets the flock go


class _Blocks:
    def __init__(self):
        self.lock = threading.Lock()
        self.owner, self.next, self.end = None, 0, 0

    def take(self, count, consecutive, pid):
        if count > BLOCK and consecutive:
            raise SystemExit(f"loopback_ports: {count} consecutive ports asked, a block holds {BLOCK}")
        with self.lock:
            if self.owner != (os.getpid(), pid):  # a forked child starts its own blocks
                self.owner, self.next, self.end = (os.getpid(), pid), 0, 0
            ports = []
            while len(ports) < count:
                if self.end - self.next < (count - len(ports) if consecutive else 2):
                    self._claim_block(pid)
                    if consecutive:
                        ports = []
                port = self.next
                if consecutive:
                    self.next += 1
                    ports = ports + [port] if _binds(port) else []
                elif (port - LOWEST) % 2:
                    self.next += 1  # after a consecutive run: back on an even port
                else:
                    # Every other port: the one above stays free as well, since a volunteer takes
                    # --listen's port + 1 for the peers behind routers (ReversedLinks.h).
                    self.next += 2
                    if _binds(port) and _binds(port + 1):
                        ports.append(port)
            return ports

    def _claim_block(self, pid):
        blocks = (ephemeral_low() - LOWEST) // BLOCK
        first = random.SystemRandom().randrange(blocks)
        for i in range(blocks):
            k = (first + i) % blocks
            if _claim(k, pid):
                self.next = LOWEST + k * BLOCK
                self.end = self.next + BLOCK
                return
        raise SystemExit(f"loopback_ports: every block of loopback ports below the ephemeral range "
                         f"is held ({CLAIMS})")


_blocks = _Blocks()


def free_ports(count, pid=None):
    """COUNT distinct loopback ports, free now, that no other process gets from here while this
    process (or pid) lives; the port above each is free and kept so too (a volunteer listening on
    port P takes P + 1 for the peers behind routers)."""
    return _blocks.take(count, False, pid or os.getpid())


def free_port_base(count, pid=None):
    """A base port with COUNT consecutive free loopback ports, held as free_ports holds them."""
    return _blocks.take(count, True, pid or os.getpid())[0]


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].isdigit() or not 1 <= int(sys.argv[1]) <= BLOCK:
        print(f"usage: loopback_ports.py COUNT (an integer from 1 to {BLOCK})", file=sys.stderr)
        sys.exit(2)
    # Held for the caller's life (the script that runs this and then starts processes on them).
    print(free_port_base(int(sys.argv[1]), pid=os.getppid()))
