#!/usr/bin/python3
"""Writes new initial weights for a model by hand (json + struct), for clusterize_tests.

write_weights.py MODEL.pt OUT.safetensors REFERENCE.pt
Draws new values for every floating-point parameter and buffer of MODEL.pt (seeded; BatchNorm
running_var stays positive) and sets integer buffers to 7, writes them to OUT.safetensors without
any safetensors library, and saves the model holding the same values as REFERENCE.pt (the
expected weights of every stage after `clusterize --weights OUT.safetensors`). Tied tensors are
written once, under their first name, as Hugging Face tools do.
"""
import json
import struct
import sys

import torch

CODES = {torch.float32: ("F32", "f"), torch.float64: ("F64", "d"), torch.int64: ("I64", "q")}


def main():
    model_path, out_path, reference_path = sys.argv[1:4]
    model = torch.jit.load(model_path)
    torch.manual_seed(11)
    header, chunks, offset, seen = {}, [], 0, set()
    with torch.no_grad():
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if tensor.dtype.is_floating_point:
                tensor.copy_(torch.rand(tensor.shape) + 0.5 if "running_var" in name else torch.randn(tensor.shape))
            else:
                tensor.fill_(7)
            key = (tensor.data_ptr(), tuple(tensor.shape))
            if key in seen:
                continue
            seen.add(key)
            dtype, code = CODES[tensor.dtype]
            values = tensor.flatten().tolist()
            chunk = struct.pack("<%d%s" % (len(values), code), *values)
            header[name] = {"dtype": dtype, "shape": list(tensor.shape), "data_offsets": [offset, offset + len(chunk)]}
            chunks.append(chunk)
            offset += len(chunk)
    text = json.dumps(header).encode("utf-8")
    with open(out_path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for chunk in chunks:
            f.write(chunk)
    torch.jit.save(model, reference_path)


if __name__ == "__main__":
    main()
