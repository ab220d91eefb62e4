#!/usr/bin/python3
"""Reference for bench_allreduce: torch.distributed.all_reduce (sum) on the gloo backend among N
local processes, measured exactly as bench_allreduce measures cairn: per round, refill (untimed),
barrier, time the all-reduce on every rank, take the slowest rank's time (an all-reduce max of the
timings); median of --rounds rounds after --warmup. Rank 0 prints one JSON line per size.

Run with Debian's python3 (it has torch): /usr/bin/python3 tools/bench/allreduce_gloo.py --ranks 4
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run_rank(rank, args):
    torch.set_num_threads(args.torch_threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank,
                            world_size=args.ranks)
    for size_mb in args.sizes_mb:
        elements = int(size_mb * 1e6 / 4)
        data = torch.empty(elements, dtype=torch.float32)
        slowest = torch.empty(1, dtype=torch.float64)
        timed = []
        for round_ in range(args.warmup + args.rounds):
            data.fill_(float(rank + 1))
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(data, op=dist.ReduceOp.SUM)
            slowest.fill_(time.perf_counter() - start)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if round_ >= args.warmup:
                timed.append(slowest.item())
        expected = args.ranks * (args.ranks + 1) / 2
        assert torch.equal(data, torch.full_like(data, expected)), "gloo result is wrong"
        if rank == 0:
            median = statistics.median(timed)
            nbytes = elements * 4
            print(json.dumps({"impl": "gloo", "ranks": args.ranks, "bytes": nbytes,
                              "median_s": round(median, 6), "algbw_GBps": round(nbytes / median / 1e9, 4),
                              "rounds_s": timed}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--sizes-mb", type=lambda s: [float(x) for x in s.split(",")], default=[100.0])
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--port", type=int, default=5800)
    parser.add_argument("--torch-threads", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.start_processes(run_rank, args=(args,), nprocs=args.ranks, join=True, start_method="spawn")


if __name__ == "__main__":
    main()
