#!/usr/bin/python3
"""Config fuzz at the binary level: broken node.json / job.json / plan.json files fed to
the real `provider --name node_0` and `clusterize --merge`, each expected to exit with code 2 and
one error naming the file and the key (or what is wrong with the file).

    /usr/bin/python3 tests/cli/config_fuzz.py --provider build/node/provider \
        --clusterize build/clusterize/clusterize [--work DIR] [--only CASE]

Reference: the unbroken node_data (clusterize's plan of the example CNN for one node: one root_leaf
stage, 1 training step on a 256-image slice of Fashion-MNIST) must train (provider) and merge
(clusterize --merge) with exit code 0 and the same flags first; every case then
changes exactly one thing in a fresh copy of it. A case fails on any other exit code (a crash is
-6/-11, a hang hits the timeout) or when the message lacks the file or the key.
"""
import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXAMPLE = os.path.join(REPO, "examples", "fashion_mnist")
PY = "/usr/bin/python3"
TIMEOUT_S = 60


def load(path):
    with open(path) as f:
        return json.load(f)


def save(path, doc):
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def edit(rel, change):
    """A mutation that loads rel (relative to node_data) as JSON, applies change(doc), saves it."""
    def apply(nd):
        doc = load(os.path.join(nd, rel))
        change(doc)
        save(os.path.join(nd, rel), doc)
    return apply


def setp(*path_and_value):
    *keys, value = path_and_value

    def change(doc):
        for k in keys[:-1]:
            doc = doc[k]
        doc[keys[-1]] = value
    return change


def delp(*keys):
    def change(doc):
        for k in keys[:-1]:
            doc = doc[k]
        del doc[keys[-1]]
    return change


def replace_file(rel, text):
    return lambda nd: write(os.path.join(nd, rel), text)


def make_dir(rel):
    def apply(nd):
        os.remove(os.path.join(nd, rel))
        os.makedirs(os.path.join(nd, rel))
    return apply


def dangling_link(rel):
    def apply(nd):
        os.remove(os.path.join(nd, rel))
        os.symlink(os.path.join(nd, "does-not-exist.json"), os.path.join(nd, rel))
    return apply


def unreadable(rel):
    def apply(nd):
        os.chmod(os.path.join(nd, rel), 0)
    return apply


NODE = "nodes/node_0/node.json"
JOB = "job.json"
PLAN = "plan.json"
TD = "training_definition"

# (name, binary, mutation, file named in the message, key/what named in the message)
CASES = [
    # node.json
    ("node_missing_address", "provider", edit(NODE, delp("address")), NODE, "address"),
    ("node_stage_wrong_type", "provider", edit(NODE, setp("stage", "zero")), NODE, "stage"),
    ("node_cluster_negative", "provider", edit(NODE, setp("cluster", -1)), NODE, "cluster"),
    ("node_stage_out_of_range", "provider", edit(NODE, setp("stage", 3)), NODE, "stage"),
    ("node_num_stages_huge", "provider", edit(NODE, setp("num_stages", 1e30)), NODE, "num_stages"),
    ("node_address_no_port", "provider", edit(NODE, setp("address", "127.0.0.1")), NODE, "address"),
    ("node_address_port_too_big", "provider", edit(NODE, setp("address", "127.0.0.1:70000")), NODE, "address"),
    ("node_address_port_zero", "provider", edit(NODE, setp("address", "127.0.0.1:0")), NODE, "address"),
    ("node_unknown_key", "provider", edit(NODE, setp("adress", "127.0.0.1:1")), NODE, "adress"),
    ("node_format_4", "provider", edit(NODE, setp("format", 4)), NODE, "format"),
    ("node_role_mismatch", "provider", edit(NODE, setp("role", "stem")), NODE, "role"),
    ("node_shared_one_stage", "provider",
     edit(NODE, setp("shared_parameters", [{"name": "0.weight", "stages": [0, 0], "local_name": "0.weight"}])),
     NODE, "shared_parameters[0].stages"),
    ("node_shared_wrong_type", "provider", edit(NODE, setp("shared_parameters", "0.weight")), NODE,
     "shared_parameters"),
    ("node_name_mismatch", "provider", edit(NODE, setp("name", "node_7")), NODE, "node_7"),
    ("node_wrong_job_id", "provider", edit(NODE, setp("job_id", "another-job")), NODE, "job_id"),
    ("node_duplicate_parameter", "provider",
     edit(NODE, lambda d: d["parameters"].append(d["parameters"][0])), NODE, "parameters"),
    ("node_inputs_wrong_type", "provider", edit(NODE, setp("inputs", {"x": 1})), NODE, "inputs"),
    ("node_input_bad_dtype", "provider", edit(NODE, lambda d: d["inputs"][0].update(dtype="float128")),
     NODE, "dtype"),
    ("node_truncated", "provider", lambda nd: write(os.path.join(nd, NODE),
                                                    open(os.path.join(nd, NODE)).read()[:40]), NODE, "not valid JSON"),
    ("node_empty_file", "provider", replace_file(NODE, ""), NODE, "empty"),
    ("node_top_level_array", "provider", replace_file(NODE, "[1, 2]"), NODE, "object"),
    ("node_is_directory", "provider", make_dir(NODE), NODE, "directory"),
    ("node_dangling_symlink", "provider", dangling_link(NODE), NODE, "cannot open"),
    ("node_unreadable", "provider", unreadable(NODE), NODE, "cannot open"),
    ("node_stage_file_missing", "provider", lambda nd: os.remove(os.path.join(nd, "nodes/node_0/stage.pt")),
     "nodes/node_0/stage.pt", "stage"),
    ("node_stage_file_garbage", "provider", replace_file("nodes/node_0/stage.pt", "not a zip archive"),
     "nodes/node_0/stage.pt", "stage"),
    # job.json
    ("job_missing_training_definition", "provider", edit(JOB, delp(TD)), JOB, TD),
    ("job_batch_size_negative", "provider", edit(JOB, setp(TD, "batch_size", -4)), JOB, "batch_size"),
    ("job_batch_size_string", "provider", edit(JOB, setp(TD, "batch_size", "128")), JOB, "batch_size"),
    ("job_batch_size_huge", "provider", edit(JOB, setp(TD, "batch_size", 1e18)), JOB, "batch_size"),
    ("job_microbatches_zero", "provider", edit(JOB, setp(TD, "microbatches", 0)), JOB, "microbatches"),
    ("job_microbatches_above_batch", "provider", edit(JOB, setp(TD, "microbatches", 1000)), JOB, "microbatches"),
    ("job_unknown_training_key", "provider", edit(JOB, setp(TD, "lerning_rate", 0.1)), JOB, "lerning_rate"),
    ("job_unknown_top_key", "provider", edit(JOB, setp("jobid", "x")), JOB, "jobid"),
    ("job_optimizer_unknown", "provider", edit(JOB, setp(TD, "optimizer", "name", "sgdx")), JOB, "optimizer"),
    ("job_lr_negative", "provider", edit(JOB, setp(TD, "optimizer", "lr", -0.1)), JOB, "lr"),
    ("job_schedule_unknown", "provider", edit(JOB, setp(TD, "schedule", "asink")), JOB, "schedule"),
    ("job_sync_unknown", "provider", edit(JOB, setp(TD, "sync", "bogus")), JOB, "sync"),
    ("job_peer_timeout_negative", "provider", edit(JOB, setp(TD, "timeouts", {"peer_s": -1})), JOB, "peer_s"),
    ("job_threads_huge", "provider", edit(JOB, setp(TD, "threads", 100000)), JOB, "threads"),
    ("job_epochs_fractional", "provider", edit(JOB, setp(TD, "epochs", 1.5)), JOB, "epochs"),
    ("job_data_format_unknown", "provider", edit(JOB, setp("data", "format", "csv")), JOB, "format"),
    ("job_data_location_missing", "provider", edit(JOB, setp("data", "location", "/nonexistent/fmnist")),
     "/nonexistent/fmnist", "train-images"),
    ("job_id_too_long", "provider", edit(JOB, setp("job_id", "j" * 200)), JOB, "job_id"),
    ("job_format_string", "provider", edit(JOB, setp("format", "1")), JOB, "format"),
    ("job_truncated", "provider", lambda nd: write(os.path.join(nd, JOB), open(os.path.join(nd, JOB)).read()[:-30]),
     JOB, "not valid JSON"),
    ("job_is_directory", "provider", make_dir(JOB), JOB, "directory"),
    ("job_empty_file", "provider", replace_file(JOB, "  \n"), JOB, "empty"),
    # plan.json, read by clusterize --merge
    ("plan_missing", "merge", lambda nd: os.remove(os.path.join(nd, PLAN)), PLAN, "cannot open"),
    ("plan_truncated", "merge", lambda nd: write(os.path.join(nd, PLAN), open(os.path.join(nd, PLAN)).read()[:50]),
     PLAN, "not valid JSON"),
    ("plan_clusters_wrong_type", "merge", edit(PLAN, setp("clusters", "all")), PLAN, "clusters"),
    ("plan_format_4", "merge", edit(PLAN, setp("format", 4)), PLAN, "format"),
]


def run(cmd):
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {TIMEOUT_S} s"
    return proc.returncode, proc.stdout + proc.stderr


def make_base(args, work):
    base = os.path.join(work, "base")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(work, exist_ok=True)
    model = os.path.join(work, "model.pt")
    subprocess.run([PY, os.path.join(EXAMPLE, "make_model.py"), "--out", model], check=True,
                   stdout=subprocess.DEVNULL)
    save(os.path.join(work, "node_configs.json"),
         {"0": {"IP": f"127.0.0.1:{27000 + os.getpid() % 2000}", "benchmarks": {"ram": 1, "bandwidth": 1000}}})
    job = load(os.path.join(EXAMPLE, "job.json"))
    job["model"] = model
    job[TD].update({"epochs": 0, "max_steps": 1, "batch_size": 32, "microbatches": 1})
    job["data"].update({"train_samples": 256, "test_samples": 64})
    save(os.path.join(work, "job.in.json"), job)
    subprocess.run([args.clusterize, "--model", model, "--nodes", os.path.join(work, "node_configs.json"),
                    "--job", os.path.join(work, "job.in.json"), "--clusters", "1", "--input-shape", "32,1,28,28",
                    "--profile-runs", "1", "--out", base], check=True, stdout=subprocess.DEVNULL)
    return base


def command(args, kind, nd):
    if kind == "provider":
        return [args.provider, "--name", "node_0", "--node-data", nd, "--insecure"]
    return [args.clusterize, "--merge", nd, "--out", os.path.join(nd, "merged.pt")]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--provider", required=True)
    p.add_argument("--clusterize", required=True)
    p.add_argument("--work", default=None)
    p.add_argument("--only", action="append")
    args = p.parse_args()
    work = args.work or os.path.join(os.environ.get("TMPDIR", "/tmp"), f"cairn_config_fuzz_{os.getpid()}")
    base = make_base(args, work)

    # The reference: the unbroken copy trains (provider) and merges (clusterize) with exit code 0.
    rc, text = run(command(args, "provider", base))
    if rc != 0:
        sys.exit(f"FAIL: the unbroken node_data does not train (exit {rc}):\n{text[-3000:]}")
    rc, text = run(command(args, "merge", base))
    if rc != 0:
        sys.exit(f"FAIL: the unbroken node_data does not merge (exit {rc}):\n{text[-3000:]}")

    def one(index, case):
        name, kind, mutate, file_named, key_named = case
        # Numbered folders: the case's name must not appear in the path the message names.
        nd = os.path.join(work, f"case{index:02d}")
        shutil.rmtree(nd, ignore_errors=True)
        shutil.copytree(base, nd, symlinks=True)
        mutate(nd)
        rc, text = run(command(args, kind, nd))
        errors = [l for l in text.splitlines() if "error" in l.lower()]
        problems = []
        if rc != 2:
            problems.append(f"exit code {rc}, expected 2")
        if file_named not in text:
            problems.append(f"message does not name {file_named!r}")
        if key_named.lower() not in text.lower():
            problems.append(f"message does not name {key_named!r}")
        if not problems:
            shutil.rmtree(nd, ignore_errors=True)
        return name, rc, (errors[0] if errors else text.strip()[-300:]), text, problems

    todo = []
    skipped = 0
    for index, case in enumerate(CASES):
        if args.only and case[0] not in args.only:
            continue
        if case[0] == "node_unreadable" and os.geteuid() == 0:
            print(f"skip {case[0]}: root reads a mode-000 file (node_dangling_symlink covers cannot-open)")
            skipped += 1
            continue
        todo.append((index, case))
    # Two at a time: each case is one short process start (mostly loading libtorch).
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda ic: one(*ic), todo))
    failures = []
    for name, rc, first_error, text, problems in results:
        print(f"{'ok  ' if not problems else 'FAIL'} {name:34s} exit {rc}: {first_error.strip()[:220]}")
        if problems:
            failures.append(f"{name}: {'; '.join(problems)}\n    output: {text.strip()[-600:]}")
    ran = len(results)
    print(f"config_fuzz: {ran - len(failures)}/{ran} cases exit 2 naming file and key ({skipped} skipped)")
    if failures:
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
