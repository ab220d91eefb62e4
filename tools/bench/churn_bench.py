#!/usr/bin/python3
"""Churn (issue [Q], docs/BENCHMARKS.md "Churn"): 24 real volunteers on this machine, with and
without kills, side by side in one invocation.

    /usr/bin/python3 tools/bench/churn_bench.py                       # 1 round: ~12 min here
    /usr/bin/python3 tools/bench/churn_bench.py --rounds 2 --kill-every 40 --work /tmp/churn
    /usr/bin/python3 tools/bench/churn_bench.py --against /tmp/build_old --work /tmp/churn_ab

Each round runs tools/soak.py twice (the order alternating from round to round): `--faults none`
(24 volunteers: 6 clusters of 3 and 6 spares, no growth) and `--faults kill --no-overlap` (the same
run, with a SIGKILL of a placed volunteer every --kill-every steps of a cluster up to 60% of the
steps, each after the run settled from the one before; a spare takes the node over from its last
checkpoint). Both runs pass every check of the soak (samples trained once, accuracies equal to
PyTorch's evaluation of the weights, exits) or the benchmark stops. From each soak's report.json
"figures" (tools/soak.py `figures`): the time from starting the 18 planned volunteers at once to
the coordinator's plan; each kill's time to the spare's first step; the training throughput
(distinct cluster steps x batch over the training span, which ends with the slowest cluster; and
the same while every cluster trains, up to the first cluster's last step). Prints a table (medians over rounds, the
kills' p50 and p99 over every kill of every round) and writes WORK/churn.json.

--against OTHER_BUILD compares two builds under the same churn instead: each round runs the kill
soak with --build and with OTHER_BUILD (the order alternating), and the table has a column each.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def soak(args, work, faults, build=None):
    cmd = ["/usr/bin/python3", os.path.join(REPO, "tools/soak.py"), "--build", build or args.build,
           "--work", work, "--volunteers", "24", "--clusters", "6", "--steps", str(args.steps),
           "--seed", str(args.seed), "--no-grow", "--no-overlap", "--faults", faults,
           "--kill-every", str(args.kill_every), "--timeout-s", "1800",
           "--peer-timeout-s", str(args.peer_timeout_s)]
    print("churn_bench: $ " + " ".join(cmd), file=sys.stderr, flush=True)
    with open(work + ".log", "w") as log:
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    if code != 0:
        sys.exit(f"churn_bench: the soak failed (exit {code}); its log: {work}.log")
    report = json.load(open(os.path.join(work, "report.json")))
    fig = report["figures"]
    fig["kills"] = sum(1 for f in report["fired"] if f["kind"] == "kill")
    print(f"churn_bench: {faults}: {json.dumps(fig)}", file=sys.stderr, flush=True)
    return fig


def percentile(values, q):
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 100)) - 1))]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--work", default="/tmp/cairn_churn")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--kill-every", type=int, default=40,
                   help="steps between kills (40 of the soak's 200: about one a minute here)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--peer-timeout-s", type=float, default=2,
                   help="the job's timeouts.peer_timeout_s (the soak's 2; the job default is 10)")
    p.add_argument("--against", metavar="OTHER_BUILD",
                   help="compare the kill soak of --build with that of this build instead")
    args = p.parse_args()
    if args.rounds < 1 or args.steps < 10 or args.kill_every < 1 or not args.peer_timeout_s > 0:
        p.error("--rounds, --steps (>= 10), --kill-every and --peer-timeout-s must be positive")
    if args.against and not os.path.isfile(os.path.join(args.against, "node/provider")):
        p.error(f"--against {args.against}: no node/provider there (a cairn build folder?)")
    os.makedirs(args.work, exist_ok=True)
    if args.against:
        return compare(args)
    runs = {"none": [], "kill": []}
    for r in range(args.rounds):
        order = ["none", "kill"] if r % 2 == 0 else ["kill", "none"]
        for faults in order:
            runs[faults].append(soak(args, os.path.join(args.work, f"{faults}_{r}"), faults))
    calm, churn = runs["none"], runs["kill"]
    kills = [k for run in churn for k in run["kill_to_first_step_s"] if k is not None]
    missed = sum(1 for run in churn for k in run["kill_to_first_step_s"] if k is None)
    med = lambda runs, key: statistics.median(run[key] for run in runs)  # noqa: E731
    per_minute = statistics.median(60 * run["kills"] / run["training_s"] for run in churn)
    result = {
        "rounds": args.rounds, "steps": args.steps, "kill_every": args.kill_every, "seed": args.seed,
        "join_to_plan_s": round(med(calm + churn, "join_to_plan_s"), 1),
        "samples_per_s_without": med(calm, "samples_per_s"), "samples_per_s_with": med(churn, "samples_per_s"),
        "kills_per_minute": round(per_minute, 2), "kills": len(kills) + missed, "kills_without_a_first_step": missed,
        "kill_to_first_step_p50_s": percentile(kills, 50) if kills else None,
        "kill_to_first_step_p99_s": percentile(kills, 99) if kills else None,
        "runs": runs}
    result["ratio"] = round(result["samples_per_s_with"] / result["samples_per_s_without"], 3)
    # While every cluster trains (tools/soak.py figures; absent from reports of older soaks).
    if all("samples_per_s_all_training" in run for run in calm + churn):
        result["all_training_without"] = med(calm, "samples_per_s_all_training")
        result["all_training_with"] = med(churn, "samples_per_s_all_training")
        result["all_training_ratio"] = round(result["all_training_with"] / result["all_training_without"], 3)
    json.dump(result, open(os.path.join(args.work, "churn.json"), "w"), indent=1)
    print("| figure | value |\n|---|---:|")
    print(f"| 18 volunteers' concurrent joins to the plan (median of {2 * args.rounds} runs) | {result['join_to_plan_s']} s |")
    print(f"| throughput without faults (samples/s, 6 clusters) | {result['samples_per_s_without']} |")
    print(f"| throughput with {result['kills_per_minute']} kills a minute | {result['samples_per_s_with']} |")
    print(f"| ratio (goal >= 0.8) | {result['ratio']} |")
    if "all_training_ratio" in result:
        print(f"| while every cluster trains: without / with / ratio | {result['all_training_without']} / "
              f"{result['all_training_with']} / {result['all_training_ratio']} |")
    print(f"| kill to the spare's first step, p50 / p99 over {len(kills)} kills | "
          f"{result['kill_to_first_step_p50_s']} s / {result['kill_to_first_step_p99_s']} s |")
    if missed:
        print(f"({missed} kill(s) had no first step of a spare before the run ended)")


def compare(args):
    builds = {"build": args.build, "against": args.against}
    runs = {"build": [], "against": []}
    for r in range(args.rounds):
        order = ["build", "against"] if r % 2 == 0 else ["against", "build"]
        for which in order:
            runs[which].append(soak(args, os.path.join(args.work, f"{which}_{r}"), "kill", builds[which]))
    result = {"rounds": args.rounds, "steps": args.steps, "kill_every": args.kill_every,
              "seed": args.seed, "peer_timeout_s": args.peer_timeout_s, "builds": builds, "runs": runs}
    for which, done in runs.items():
        kills = [k for run in done for k in run["kill_to_first_step_s"] if k is not None]
        result[which] = {
            "kills": len(kills), "kills_without_a_first_step":
                sum(1 for run in done for k in run["kill_to_first_step_s"] if k is None),
            "kill_to_first_step_p50_s": percentile(kills, 50) if kills else None,
            "kill_to_first_step_p99_s": percentile(kills, 99) if kills else None,
            "samples_per_s": statistics.median(run["samples_per_s"] for run in done),
            "samples_per_s_all_training":
                statistics.median(run.get("samples_per_s_all_training", 0) for run in done)}
    json.dump(result, open(os.path.join(args.work, "churn.json"), "w"), indent=1)
    b, a = result["build"], result["against"]
    print(f"| kill soak, {args.rounds} round(s) | {args.build} | {args.against} |\n|---|---:|---:|")
    print(f"| kills (without a spare's first step) | {b['kills']} ({b['kills_without_a_first_step']}) | "
          f"{a['kills']} ({a['kills_without_a_first_step']}) |")
    print(f"| kill to the spare's first step, p50 / p99 | {b['kill_to_first_step_p50_s']} s / "
          f"{b['kill_to_first_step_p99_s']} s | {a['kill_to_first_step_p50_s']} s / {a['kill_to_first_step_p99_s']} s |")
    print(f"| throughput, whole run (samples/s) | {b['samples_per_s']} | {a['samples_per_s']} |")
    print(f"| the same while every cluster trains | {b['samples_per_s_all_training']} | "
          f"{a['samples_per_s_all_training']} |")


if __name__ == "__main__":
    main()
