#!/usr/bin/python3
"""A flooding volunteer beside a run (issue [Q], docs/OPERATIONS.md "Floods"):

    volunteer_flood_test.py --provider P --clusterize C --flooder F --work DIR

The same 2 clusters x 2 stages job (4 real `provider --join` volunteers on loopback, the example
Fashion-MNIST CNN, 60 steps, "average" syncs) runs twice: once alone (the reference), once with
`flood_volunteer` (tests/node/FloodVolunteerMain.cpp) beside it. The flooder holds the invite and
joins as a real volunteer once the run is planned (its own key, a reachability responder; it is a
spare), then until the run ends sends, as fast as ZeroMQ takes them, joins, heartbeats,
4,096-record metrics batches, chunk requests for the largest piece and 8 MiB checkpoint uploads.
Both Roots hold before step 20 (CAIRN_TEST_HOLD) until the coordinator has blocked the flooder's
key, so the flood is under way while the run trains whatever the machine's speed. Checked
(outcomes only): every step's loss of every cluster's Leaf equals the reference's exactly; the
coordinator told the flooder that it sends too much and blocked its key once (its log and the
flooder's replies); every volunteer and the coordinator exit 0, the flooder on SIGTERM. Printed,
not checked (figures): the flooder's tally and the coordinator's peak RSS in both runs.
"""
import argparse
import os
import shutil
import signal
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import volunteer_harness as vt  # noqa: E402

STEPS = 60
HOLD_AT = 20
FLAGS = ["--min-volunteers", "4", "--clusters", "2", "--cuts", "7"]


def peak_rss_mb(pid):
    """The process's peak resident set (VmHWM) in MB; None once it is gone."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class PeakRss:
    """Samples a process's VmHWM every half second until it exits (the last sample is its peak)."""

    def __init__(self, pid):
        self.pid, self.mb, self.stop = pid, None, threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self):
        while not self.stop.wait(0.5):
            mb = peak_rss_mb(self.pid)
            if mb is None:
                return
            self.mb = mb

    def done(self):
        self.stop.set()
        self.thread.join(5)
        return self.mb


def one_run(args, name, flood):
    """(Leaf losses, coordinator peak RSS in MB, the flooder's tally line or None). With `flood`,
    both clusters' Roots hold before step HOLD_AT (CAIRN_TEST_HOLD) until the coordinator has
    blocked the flooder: the flood is under way while the run trains, whatever the machine's speed,
    and goes on (dropped unanswered) until the run ends."""
    sub = vt.in_folder(args, name)
    release = os.path.join(sub.work, "release")
    os.environ["CAIRN_TEST_HOLD"] = f"0:{HOLD_AT}:{release},1:{HOLD_AT}:{release}" if flood else ""
    run = vt.start_run(sub, STEPS, 500, FLAGS, 4)
    rss = PeakRss(run.coordinator.proc.pid)
    flooder = None
    with run:
        run.join(4)
        run.wait_planned(2)
        if flood:
            port = vt.free_ports(1)[0]
            flooder = vt.Process("flooder", [args.flooder, "--invite", run.invite, "--listen",
                                             f"127.0.0.1:{port}", "--seconds", "900"])
            flooder.wait_for(lambda l: l.startswith("flood: joined as"), 120, "'flood: joined as'")
            blocked = run.coordinator.wait_for(lambda l: "is blocked for" in l, 120,
                                               "'is blocked for' (the flooder's key)")
            print("coordinator:", blocked.strip())
            open(release, "w").close()
        run.all_finish()
        peak = rss.done()
        if not flooder:
            return vt.leaf_losses(run.out, [w for _, w in run.volunteers]), peak, None
        flooder.proc.send_signal(signal.SIGTERM)
        if flooder.finish(60) != 0:
            vt.fail("the flooder did not exit 0 on SIGTERM")
        tally = [l for l in flooder.lines if l.startswith("flood: sent")]
        if not tally:
            vt.fail("the flooder printed no tally")
        return vt.leaf_losses(run.out, [w for _, w in run.volunteers]), peak, tally[-1].strip()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--provider", required=True)
    parser.add_argument("--clusterize", required=True)
    parser.add_argument("--flooder", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    vt.torch.set_num_threads(1)
    shutil.rmtree(args.work, ignore_errors=True)
    reference, reference_rss, _ = one_run(args, "reference", False)
    flooded, flooded_rss, tally = one_run(args, "flooded", True)
    print(tally)
    # "flood: sent N messages (B bytes); replies R; too-many T; blocked K; ..."
    fields = dict(part.strip().rsplit(" ", 1) for part in tally.split(";")[1:4])
    if int(fields.get("too-many", 0)) < 1 or int(fields.get("blocked", 0)) != 1:
        vt.fail(f"the flooder should be told once that it sends too much, then blocked once: {tally}")
    vt.check_same_losses(reference, flooded, STEPS, "the flooded run's")
    print(f"every Leaf loss of {len(reference)} clusters x {STEPS} steps equals the run without the "
          f"flooder; coordinator peak RSS {reference_rss:.0f} MB alone, {flooded_rss:.0f} MB flooded")
    print("PASS")


if __name__ == "__main__":
    main()
