"""The fixed cuts of the benchmarks' P-stage plans (`clusterize --cuts`: the unit indices where
stages 1, 2, ... begin; plan.json "units"), so that a benchmark's setup is the same on every run and
machine instead of following clusterize's timing profile of the moment (on a loaded machine one
profiling run cut the CNN for 3 equal nodes into 2 stages, which stopped the benchmark).

CNN (examples/fashion_mnist): 2 stages cut after the first pooling (25 KB of activations per
sample); 3 stages put that pooling alone in the middle; 4 stages after conv1, the first pooling and
the second pooling. Tiny GPT (examples/tiny_gpt, --granularity expand-containers: 7 units of
sizes, positions and embeddings, blocks.0-3 at units 7-10, ln_f, head): 2 stages of 2 blocks each;
3 stages: embeddings and blocks.0 | blocks.1-2 | blocks.3, ln_f, head; 4 stages of one block.
The 2- and 3-stage cuts are clusterize's own choice for P equal nodes of 10 Gbit/s with its default
profiling on an idle 2-core machine (3 runs each, 2026-11-30: CNN 3 stages chose 6,7 twice and 5,7
once; GPT 3 stages 8,10 twice and 9,10 once; the 2-stage cuts 3 of 3).
Used by training_common.py (tables 3, 4, 7, memory), netem_bench.py and nat_bench.py.
"""
CUTS = {"cnn": {2: "7", 3: "6,7", 4: "1,7,15"}, "gpt": {2: "9", 3: "8,10", 4: "8,9,10"}}
