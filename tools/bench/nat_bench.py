#!/usr/bin/python3
"""Volunteers behind home routers (issue [N]): the same job over emulated home links, (a) every
volunteer reachable, (b) all behind NAT, dial-out only, every link through one relay volunteer.

    /usr/bin/python3 tools/bench/nat_bench.py --build /tmp/bench_build            # the default rows
    /usr/bin/python3 tools/bench/nat_bench.py --rows cnn:int8:2,cnn:int8:1 --rate 50 --rtt 20
    /usr/bin/python3 tools/bench/nat_bench.py --rows gpt:fp32:2 --gpt-steps 40
    /usr/bin/python3 tools/bench/nat_bench.py --smoke                             # unshaped, 8 steps

A row is MODEL:WIRE:RELAY_LINK (MODEL cnn or gpt, WIRE fp32 / bf16 / fp16 / int8 for
training_definition.wire.activations, RELAY_LINK the relay's link as a multiple of the volunteers'
rate). Each row runs the job twice, one after the other with the same shaping: (a) then (b).

The world (network namespaces; nothing leaves them, nothing of this machine's own is touched): the
"internet" is one router namespace (tools/bench/netem_bench.py's, cnb<PID>r) with a veth to each of
6 sites, each site a namespace with one public address 10.77.<i>.2: sites 0-3 are home routers,
site 4 the relay's host, site 5 the coordinator's. Behind each home router (its own namespace,
cnb<PID>n<10+k>, 192.168.k.2) sits one volunteer; the router does what a home router does:
`iptables -t nat ... MASQUERADE` out of its WAN side, and lets in only the answers to connections
from inside, plus (run (a) only) a port forward: DNAT of TCP 7200-7201 on its public address to the
volunteer, which joins with `--listen 192.168.k.2:7200 --advertise 10.77.k.2:7200`, so the
coordinator's dial-back reaches it and it is admitted reachable. In run (b) the forward is
removed and the volunteers join with no address (`provider --join INVITE`: dial-out only), and a
fifth provider on site 4 only relays (`provider --join INVITE --relay --listen 10.77.4.2:7300
[--relay-mbps N]`), started and admitted before the homes join; the coordinator
(`clusterize --serve 10.77.5.2:7100`, no --relay of its own) routes every link through it (checked:
every peer entry of every node.json names it).

Links, shaped as netem_bench.py shapes them (imported, not copied): every home's access link is
--rate Mbit/s in each direction (a tbf qdisc on both ends of its veth: up and down), the relay's
--rate x RELAY_LINK, the coordinator's unshaped; where the kernel has no netem qdisc (this
machine's) the delay is a TUN loop in the internet namespace that holds every packet it forwards
RTT/2 (with netem: delay RTT/4 on both ends of every veth, the same total). So between two sites
the round trip is --rtt ms, and a relayed path (home -> relay -> home) crosses the internet twice:
its round trip is 2 x --rtt (the relay is one more host on the internet, as far from the homes as
they are from each other). --relay-near exempts the relay's own packets from the delay (a relay
next to the exchange: a relayed round trip of --rtt, as the direct path's; built for the TUN
delay loop only, so refused where netem shapes the links).

The jobs: cnn is the demo's (examples/fashion_mnist/job.json: batch 128 per cluster in 4
micro-batches, AdamW, cosine, `average` every step, the job's seed) in 2 clusters x 2 stages cut
after the first pooling (`--cuts 7`, as examples/fashion_mnist/run_nat.py), --steps steps, the
first --test-samples test images for the final evaluation; gpt is examples/tiny_gpt/job.json
(batch 32 in 2 micro-batches, `average` every 10 steps) over make_corpus.sh's text, 2 x 2 cut
between blocks 1 and 2 (`--cuts 9`), --gpt-steps steps. 1 intra-op thread per provider,
OMP_WAIT_POLICY=PASSIVE.

Per run: the step time of each cluster's Leaf (its metrics.jsonl step records: samples /
samples_per_s, the interval from the end of the previous step to the end of this one, as
tools/bench/step_timing.py times steps; the first --warmup steps left out; no evaluation runs
between steps), median and mean over both Leaves; the run's wall time (the coordinator's start to
its exit: joins, probes, planning, stage transfer, training, final evaluation, uploads, merge);
the bytes the nodes' step records say they sent; (b) the relay's final log line ("done: forwarded
N messages, B bytes"), its CPU seconds (utime + stime of the relay provider: /proc/PID/stat read
while it runs, and its rusage when it exits; `ip netns exec` execs, so the PID is the
provider's), and per forwarded GB those spent from the plan on (what it spent before, joining
and probing this machine, is given apart); where a step's time goes (the medians of the step
records' compute_s, wait_s and sync_s per role); the delay loop's CPU seconds (the emulation's
own cost, on the same cores: in (b) every relayed byte crosses the internet twice). Per row:
(b)/(a) of the median and the mean step time and of the wall time, and whether every Leaf loss
of (b) equals (a)'s step for step (it must: relays change nothing). Output: one JSON line per run
and per row on stdout, then a markdown table; progress on stderr. Figures and what they mean:
docs/BENCHMARKS.md "Behind home routers: relays".

Everything (processes, namespaces) is removed on exit, also on failure, Ctrl-C, SIGTERM or SIGHUP
(the namespaces of a SIGKILLed run are removed by the next run). Without root, `ip`, `tc`,
`iptables` or network namespaces it prints "nat_bench: skipped: why" and exits 0.
Build: --build DIR (default $CAIRN_BUILD_DIR, else build/), holding node/provider and
clusterize/clusterize.
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import netem_bench as nb  # noqa: E402  (its models)
from fixed_cuts import CUTS  # noqa: E402  (2 stages: after the first pooling / between blocks 1 and 2)
import netns_links as nl  # noqa: E402  (the namespaces and shaped links: tbf + the TUN delay loop)
from nat_homes import (  # noqa: E402  (the home routers, the relay's and the coordinator's sites)
    COORDINATOR_SITE, HOMES, RELAY_SITE, VOLUNTEER_PORT, HomeWorld, home_address, home_ns, public)

PY = "/usr/bin/python3"
RELAY_PORT, COORDINATOR_PORT = 7300, 7100


def log(msg):
    print("nat_bench: " + msg, file=sys.stderr, flush=True)


# ---- processes -----------------------------------------------------------------------------------

def cpu_seconds(pid, comm=None):
    """utime + stime of PID from /proc/PID/stat (None once it is gone or is not `comm`)."""
    try:
        text = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    name = text[text.index("(") + 1:text.rindex(")")]
    if comm and name != comm:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reap(proc, timeout):
    """Waits for proc (a Popen) with os.wait4: (exit code, its CPU seconds from rusage)."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_utime + usage.ru_stime
        if time.monotonic() > deadline:
            return None, None
        time.sleep(0.1)


class Failed(Exception):
    pass


def wait_line(p, predicate, timeout, what):
    """vt.Process.wait_for without its sys.exit: the line, or Failed naming `what`."""
    deadline = time.monotonic() + timeout
    with p.cond:
        while True:
            for line in p.lines:
                if predicate(line):
                    return line
            if time.monotonic() > deadline:
                raise Failed(f"{p.tag}: no {what} within {timeout} s (log {p.logpath})")
            if p.proc.poll() is not None and not p.thread.is_alive():
                raise Failed(f"{p.tag}: exited {p.proc.returncode} before {what} (log {p.logpath})")
            p.cond.wait(1.0)


# ---- jobs ----------------------------------------------------------------------------------------

def write_job(kind, steps, test_samples, wire, work, corpus):
    job = json.load(open(os.path.join(ROOT, "examples", "tiny_gpt" if kind == "gpt" else "fashion_mnist",
                                      "job.json")))
    if kind == "gpt":
        job["data"]["location"] = corpus
    job["data"]["test_samples"] = test_samples
    td = job["training_definition"]
    td.update({"epochs": 0, "max_steps": steps, "eval_every": 0, "threads": 1})
    if wire and wire != "fp32":
        td["wire"] = {"activations": wire}
    path = os.path.join(work, "job.json")
    json.dump(job, open(path, "w"), indent=2)
    return path, td["batch_size"]


# ---- one run -------------------------------------------------------------------------------------

def run_once(world, args, vt, rvt, kind, model, job, batch, relayed, relay_cap, work):
    """(a) relayed False: 4 reachable homes; (b) True: 4 dial-out-only homes and a relay volunteer."""
    os.makedirs(work)
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    world.port_forward(not relayed)
    out = os.path.join(work, "coordinator")
    coord_addr = f"{public(COORDINATOR_SITE)}:{COORDINATOR_PORT}"
    procs = []

    def start(tag, ns, cmd):
        p = vt.Process(tag, ["ip", "netns", "exec", ns] + cmd, log=os.path.join(work, tag.replace(" ", "_") + ".log"),
                       env=env)
        p.logpath = os.path.join(work, tag.replace(" ", "_") + ".log")
        procs.append(p)
        return p

    delay_loop = world.relay.pid if world.relay else None
    delay_before = cpu_seconds(delay_loop) if delay_loop else None
    load_before = os.getloadavg()
    t0 = time.monotonic()
    try:
        coordinator = start("coordinator", nl.ns_name(COORDINATOR_SITE), [
            args.clusterize, "--model", model, "--job", job, "--serve", coord_addr,
            "--invite-file", os.path.join(work, "invite.txt"), "--out", out,
            "--min-volunteers", str(HOMES), "--gather-s", "0", "--clusters", "2", "--cuts", CUTS[kind][2]]
            + nb.MODELS[kind]["flags"])
        invite = wait_line(coordinator, lambda l: l.startswith("invite: "), 180, "'invite: …'").split()[1]
        relay = relay_name = None
        if relayed:
            relay = start("relay", nl.ns_name(RELAY_SITE), [
                args.provider, "--join", invite, "--relay", "--listen", f"{public(RELAY_SITE)}:{RELAY_PORT}",
                "--workdir", os.path.join(work, "relay"), "--probe-megabytes", "1"]
                + (["--relay-mbps", f"{relay_cap:g}"] if relay_cap else []))
            wait_line(relay, lambda l: "relaying for the run at" in l, 120, "'relaying for the run at'")
            relay_name = vt.name_of(os.path.join(work, "relay"))
        homes, workdirs = [], []
        for k in range(HOMES):
            workdirs.append(os.path.join(work, f"volunteer_{k}"))
            own = [] if relayed else ["--listen", f"{home_address(k)}:{VOLUNTEER_PORT}",
                                      "--advertise", f"{public(k)}:{VOLUNTEER_PORT}"]
            homes.append(start(f"home {k}", home_ns(k), [
                args.provider, "--join", invite, "--workdir", workdirs[-1], "--probe-megabytes", "1"] + own))
        wait_line(coordinator, lambda l: f"planned 2 cluster(s) on {HOMES} volunteers" in l, 300, "'planned'")
        dial_out = sum(h.count(lambda l: "dial-out only:" in l) for h in homes)
        if dial_out != (HOMES if relayed else 0):
            raise Failed(f"{dial_out} of the {HOMES} homes joined dial-out only, expected "
                         f"{HOMES if relayed else 0}")
        links = rvt.links_of(out)
        through = {k: v for k, v in links.items() if v != relay_name}
        if through:
            raise Failed(f"links not {'through ' + relay_name if relayed else 'direct'}: {through}")
        log(f"  planned: {len(links)} links, " + (f"all through the relay {relay_name}" if relayed else "all direct"))
        # the relay's CPU before training (join, probe, attaching): left out of the marginal figure
        relay_cpu_at_plan = cpu_seconds(relay.proc.pid, "provider") if relay else None
        # training: wait for the coordinator, reading the relay's CPU while it runs
        relay_cpu_proc = None
        deadline = t0 + args.run_timeout
        while coordinator.proc.poll() is None:
            if relay:
                c = cpu_seconds(relay.proc.pid, "provider")
                relay_cpu_proc = c if c is not None else relay_cpu_proc
            if time.monotonic() > deadline:
                raise Failed(f"the run took over {args.run_timeout} s (--run-timeout)")
            time.sleep(0.5)
        wall = time.monotonic() - t0
        if coordinator.proc.returncode != 0:
            raise Failed(f"the coordinator exited {coordinator.proc.returncode} (log {coordinator.logpath})")
        for h in homes:
            code = h.finish(120)
            if code != 0:
                raise Failed(f"{h.tag} exited {code} (log {h.logpath})")
        res = {}
        if relay:
            code, relay_cpu = reap(relay.proc, 60)
            relay.thread.join(5)
            if code != 0:
                raise Failed(f"the relay exited {code} (log {relay.logpath})")
            line = wait_line(relay, lambda l: ": forwarded " in l and " bytes" in l, 5, "'forwarded …' line")
            m = re.search(r"(done|stopped): forwarded (\d+) messages, (\d+) bytes", line)
            if not m or m.group(1) != "done":
                raise Failed(f"the relay's last line: {line.strip()}")
            messages, forwarded = int(m.group(2)), int(m.group(3))
            res.update({"relay": relay_name, "relay_messages": messages, "relay_bytes": forwarded,
                        "relay_cpu_s": round(relay_cpu, 2),
                        "relay_cpu_s_proc": round(relay_cpu_proc, 2) if relay_cpu_proc is not None else None,
                        "relay_cpu_s_per_gb": round(relay_cpu / (forwarded / 1e9), 2) if forwarded else None,
                        "relay_cpu_s_at_plan": relay_cpu_at_plan,
                        "relay_cpu_s_per_gb_after_plan": round((relay_cpu - relay_cpu_at_plan) / (forwarded / 1e9), 2)
                        if forwarded and relay_cpu_at_plan is not None else None,
                        "relay_line": m.group(0)})
        delay_after = cpu_seconds(delay_loop) if delay_loop else None
        res["delay_loop_cpu_s"] = round(delay_after - delay_before, 2) if delay_before is not None and \
            delay_after is not None else None
        res.update(figures(vt, out, workdirs, batch, args.warmup))
        res.update({"wall_s": round(wall, 1), "load_before": [round(x, 2) for x in load_before],
                    "load_after": [round(x, 2) for x in os.getloadavg()]})
        if relay and res.get("step_sent_bytes"):
            res["relay_bytes_per_step_sent_byte"] = round(res["relay_bytes"] / res["step_sent_bytes"], 3)
        return res
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            try:
                p.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass


def figures(vt, out, workdirs, batch, warmup):
    """Step times of both Leaves, their losses, and what every node's step records say it sent."""
    plan = json.load(open(os.path.join(out, "plan.json")))
    holder = {vt.name_of(w): w for w in workdirs}
    times, losses, sent, leaves, split = [], {}, 0, [], {}
    for c, cluster in enumerate(plan["clusters"]):
        for i, name in enumerate(cluster["chain"]):
            records = [r for r in vt.node_records(holder[name], name) if "samples_per_s" in r]
            sent += sum(r.get("sent_bytes", 0) for r in records)
            role = "root" if i == 0 else "leaf" if i == len(cluster["chain"]) - 1 else "stem"
            for key in ("compute_s", "wait_s", "sync_s"):
                split.setdefault(f"{role}_{key}", []).extend(r.get(key, 0.0) for r in records[warmup:])
            if i == len(cluster["chain"]) - 1:
                leaves.append(name)
                losses[c] = [(r["step"], r["loss"]) for r in records]
                times += [r["samples"] / r["samples_per_s"] for r in records[warmup:]]
    steps = min(len(v) for v in losses.values())
    return {"leaves": leaves, "steps": steps, "median_step_s": round(statistics.median(times), 4),
            "mean_step_s": round(statistics.mean(times), 4), "steps_s": round(sum(times) / len(losses), 2),
            "step_sent_bytes": sent, "losses": losses, "batch_per_cluster": batch,
            # where a step's time goes (medians over both clusters' nodes of that role, step records)
            "median_split_s": {k: round(statistics.median(v), 4) for k, v in sorted(split.items()) if v}}


# ---- main ----------------------------------------------------------------------------------------

def num(x):
    return "—" if x is None else f"{x:.1f}"


def table(rows):
    out = ["| model | wire.activations | volunteers' link | relay's link (cap) | step (a) reachable, median / mean (s) "
           "| step (b) relayed, median / mean (s) | (b)/(a) median | (b)/(a) mean | wall (a) / (b) (s) "
           "| through the relay (GB; MB per step) | relay CPU s (before training) | relay CPU s per GB (training) "
           "| Leaf losses (b) = (a) |",
           "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        a, b = r.get("a") or {}, r.get("b") or {}
        if r.get("error"):
            out.append(f"| {r['model']} | {r['wire']} | {r['link']} | {r['relay_link']} | error: {r['error'][:120]} "
                       "| | | | | | | | |")
            continue
        out.append(
            f"| {r['model']} | {r['wire']} | {r['link']} | {r['relay_link']} | {a['median_step_s']:.3f} / {a['mean_step_s']:.3f} "
            f"| {b['median_step_s']:.3f} / {b['mean_step_s']:.3f} | **{r['ratio_median']:.2f}** | {r['ratio_mean']:.2f} "
            f"| {a['wall_s']:.0f} / {b['wall_s']:.0f} | {b['relay_bytes'] / 1e9:.2f}; "
            f"{b['relay_bytes'] / 1e6 / max(1, b['steps']):.1f} | {b['relay_cpu_s']:.1f} ({num(b['relay_cpu_s_at_plan'])}) "
            f"| {num(b['relay_cpu_s_per_gb_after_plan'])} "
            f"| {'yes' if r['losses_equal'] else 'NO'} |")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.environ.get("CAIRN_BUILD_DIR", os.path.join(ROOT, "build")),
                   help="build folder with node/provider and clusterize/clusterize (default $CAIRN_BUILD_DIR, "
                   "else build/)")
    p.add_argument("--rows", default="cnn:int8:2,cnn:fp32:2,cnn:int8:1",
                   help="MODEL:WIRE:RELAY_LINK,... (RELAY_LINK: the relay's link / the volunteers')")
    p.add_argument("--rate", type=float, default=50, help="each volunteer's link, Mbit/s up and down")
    p.add_argument("--rtt", type=float, default=20, help="round trip between two sites, ms")
    p.add_argument("--relay-mbps", type=float, default=0, help="the relay's cap (provider --relay-mbps); 0: none")
    p.add_argument("--relay-near", action="store_true", help="the relay's own packets are not delayed")
    p.add_argument("--steps", type=int, default=100, help="cnn steps per run")
    p.add_argument("--gpt-steps", type=int, default=60, help="gpt steps per run")
    p.add_argument("--test-samples", type=int, default=1000, help="cnn: test images of the final evaluation "
                   "(gpt: 128 blocks)")
    p.add_argument("--warmup", type=int, default=3, help="first steps left out of the step times")
    p.add_argument("--repeat", type=int, default=1, help="run the list of rows this many times, in turn")
    p.add_argument("--run-timeout", type=int, default=900, help="seconds per run")
    p.add_argument("--work", help="default BUILD/bench_nat")
    p.add_argument("--smoke", action="store_true", help="unshaped, 8 steps, the row cnn:int8:2")
    args = p.parse_args()
    args.build = os.path.abspath(args.build)
    args.provider = os.path.join(args.build, "node", "provider")
    args.clusterize = os.path.join(args.build, "clusterize", "clusterize")
    args.work = os.path.abspath(args.work or os.path.join(args.build, "bench_nat"))
    if args.smoke:
        args.rows, args.rate, args.rtt, args.steps, args.gpt_steps, args.warmup = "cnn:int8:2", 0, 0, 8, 4, 1
        args.test_samples = 200
    why = nl.preflight() or (None if shutil.which("iptables") else "`iptables` not found")
    if why:
        print(f"nat_bench: skipped: {why}", flush=True)
        return
    for binary in (args.provider, args.clusterize):
        if not os.access(binary, os.X_OK):
            raise SystemExit(f"nat_bench: {binary} not found (--build or CAIRN_BUILD_DIR)")
    rows_spec = []
    for item in args.rows.split(","):
        kind, wire, mult = item.split(":")
        if kind not in CUTS:
            raise SystemExit(f"nat_bench: --rows: unknown model {kind}")
        rows_spec.append((kind, wire, float(mult)))
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    import volunteer_harness as vt  # noqa: E402  (Process, name_of, node_records; imports torch)
    import relay_volunteer_test as rvt  # noqa: E402  (links_of: each link's relay, both ends agreeing)
    models, corpus = {}, None
    for kind in {k for k, _, _ in rows_spec}:
        models[kind] = os.path.join(args.work, f"{kind}.pt")
        nl.run([PY, f"examples/{'tiny_gpt' if kind == 'gpt' else 'fashion_mnist'}/make_model.py", "--out",
                models[kind]], cwd=ROOT)
        if kind == "gpt":
            corpus = os.path.join(args.work, "corpus.txt")
            nl.run(["examples/tiny_gpt/make_corpus.sh", corpus], cwd=ROOT)
    nl.remove_stale()

    def on_signal(signum, _frame):
        raise SystemExit(f"nat_bench: signal {signum}, cleaning up")
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    world = HomeWorld()
    rows, started = [], time.monotonic()
    try:
        try:
            world.up()
        except RuntimeError as e:
            print(f"nat_bench: skipped: cannot build the namespaces, links and NAT: {e}", flush=True)
            return
        netem, why_not = world.netem_available()
        if args.rate:
            if not netem:
                log(f"tc netem unavailable ({why_not}); rate by tbf, delay by the TUN loop")
            shaping = world.shape_homes(args.rate, args.rtt, netem, args.relay_near)
            measured, mbit = world.rtt_ms(), world.throughput_mbit()
            link = f"{args.rate:g} Mbit/s, {args.rtt:g} ms RTT"
        else:
            shaping, measured, mbit, link = "none", world.rtt_ms(), None, "unshaped"
        log(f"links: {link}; shaping {shaping}; measured between two home routers: TCP-connect round trip "
            f"{measured:.1f} ms" + (f", bulk TCP {mbit:.1f} Mbit/s" if mbit else ""))
        for repeat, (kind, wire, mult) in [(n, r) for n in range(args.repeat) for r in rows_spec]:
            relay_mbit = args.rate * mult if args.rate else 0
            world.relay_link(relay_mbit, netem, args.rtt)
            relay_link = (f"{relay_mbit:g} Mbit/s ({mult:g}x)" if relay_mbit else "unshaped") + \
                (f", cap {args.relay_mbps:g} Mbit/s" if args.relay_mbps else ", no cap") + \
                (", near" if args.relay_near else "")
            label = f"{kind}_{wire}_{mult:g}x" + (f"_{repeat + 1}" if args.repeat > 1 else "")
            row = {"table": "nat", "model": kind, "wire": wire, "link": link, "rate_mbit": args.rate,
                   "rtt_ms": args.rtt, "relay_link": relay_link, "relay_link_mbit": relay_mbit,
                   "relay_cap_mbit": args.relay_mbps or None, "relay_near": args.relay_near, "shaping": shaping,
                   "measured_rtt_ms": round(measured, 2), "measured_bulk_mbit": round(mbit, 1) if mbit else None,
                   "steps": args.gpt_steps if kind == "gpt" else args.steps, "repeat": repeat + 1}
            rdir = os.path.join(args.work, label)
            os.makedirs(rdir)
            job, batch = write_job(kind, row["steps"], 128 if kind == "gpt" else args.test_samples, wire,
                                   rdir, corpus)
            try:
                for which, relayed in (("a", False), ("b", True)):
                    log(f"{label}: ({which}) {'all behind NAT, one relay' if relayed else 'every volunteer reachable'} ...")
                    res = run_once(world, args, vt, rvt, kind, models[kind], job, batch, relayed,
                                   args.relay_mbps, os.path.join(rdir, which))
                    row[which] = res
                    slim = {k: v for k, v in res.items() if k != "losses"}
                    print(json.dumps({"table": "nat_run", "row": label, "run": which, **slim}), flush=True)
                    log(f"{label}: ({which}) median {res['median_step_s']:.3f} s, mean {res['mean_step_s']:.3f} s per "
                        f"step, wall {res['wall_s']:.0f} s" + (f"; relay {res['relay_bytes']:,} bytes, "
                                                               f"{res['relay_cpu_s']} s CPU" if relayed else ""))
                a, b = row["a"], row["b"]
                row["losses_equal"] = a["losses"] == b["losses"] and a["steps"] == row["steps"]
                row["ratio_median"] = round(b["median_step_s"] / a["median_step_s"], 3)
                row["ratio_mean"] = round(b["mean_step_s"] / a["mean_step_s"], 3)
                row["ratio_wall"] = round(b["wall_s"] / a["wall_s"], 3)
                if not row["losses_equal"]:
                    diff = [(c, x, y) for c in a["losses"] for x, y in zip(a["losses"][c], b["losses"].get(c, []))
                            if x != y][:5]
                    log(f"{label}: the Leaf losses differ: {diff}")
            except (Failed, RuntimeError, SystemExit) as e:
                if isinstance(e, SystemExit) and "signal" in str(e):
                    raise
                row["error"] = str(e)[:600]
                log(f"{label}: error: {row['error']}")
            for which in ("a", "b"):
                if which in row:
                    row[which] = {k: v for k, v in row[which].items() if k != "losses"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        world.down()
    print()
    print(table(rows), flush=True)
    log(f"done in {time.monotonic() - started:.0f} s; load average now "
        f"{'/'.join(f'{x:.2f}' for x in os.getloadavg())}")
    if any(r.get("error") or not r.get("losses_equal") for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
