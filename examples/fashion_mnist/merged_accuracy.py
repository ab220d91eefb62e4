"""The coordinator's merged model (run_result.json's trained_torchscript) evaluated by PyTorch on
each cluster's Leaf's test images (the first `samples` of Fashion-MNIST's t10k, normalized as the
job says, one intra-op thread as the providers compute): the demos check it equals the accuracy the
Leaf reported, to the last bit (run_volunteers.sh, run_nat.py)."""
import gzip
import json
import os


def merged_accuracies(run_result_path, job_path):
    """(run_result.json as a dict, [(its cluster entry, the merged model's accuracy), ...])."""
    import numpy as np
    import torch
    torch.set_num_threads(1)
    result = json.load(open(run_result_path))
    job = json.load(open(job_path))
    norm, folder = job["data"]["normalize"], job["data"]["location"]

    def idx(name, offset):
        return np.frombuffer(gzip.open(os.path.join(folder, name)).read(), np.uint8, offset=offset)

    net = torch.jit.load(result["trained_torchscript"])
    net.eval()
    out = []
    for c in result["clusters"]:
        n = c["eval"]["samples"]
        images = idx("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)[:n]
        labels = torch.from_numpy(idx("t10k-labels-idx1-ubyte.gz", 8)[:n].astype(np.int64))
        x = (torch.from_numpy(images.astype(np.float32)) / 255.0 - norm["mean"][0]) / norm["std"][0]
        with torch.no_grad():
            logits = torch.cat([net(x[i:i + 500]) for i in range(0, n, 500)])
        out.append((c, (logits.argmax(1) == labels).double().mean().item()))
    return result, out
