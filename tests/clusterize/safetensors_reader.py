#!/usr/bin/python3
"""An independent safetensors reader (json + struct only) for clusterize_tests.

safetensors_reader.py FILE.safetensors MODEL.pt
Parses FILE by hand (8-byte little-endian header length, JSON header, data section), checks the
format's rules (offsets inside the data, no overlaps or holes, bytes = elements x item size), and
compares every tensor with the state dict of MODEL.pt as torch.jit.load gives it: same names, same
shapes and dtypes, identical values. Exits 1 with a message on the first difference.
"""
import json
import struct
import sys

import torch

# safetensors dtype -> (struct code, item size, torch dtype)
DTYPES = {
    "F64": ("d", 8, torch.float64), "F32": ("f", 4, torch.float32), "F16": ("e", 2, torch.float16),
    "I64": ("q", 8, torch.int64), "I32": ("i", 4, torch.int32), "I16": ("h", 2, torch.int16),
    "I8": ("b", 1, torch.int8), "U8": ("B", 1, torch.uint8), "BOOL": ("?", 1, torch.bool),
}


def fail(message):
    print("safetensors_reader: " + message)
    sys.exit(1)


def read(path):
    data = open(path, "rb").read()
    (length,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + length].decode("utf-8"))
    body = data[8 + length:]
    metadata = header.pop("__metadata__", {})
    tensors = {}
    ranges = []
    for name, entry in header.items():
        code, size, dtype = DTYPES[entry["dtype"]]
        shape = entry["shape"]
        begin, end = entry["data_offsets"]
        count = 1
        for d in shape:
            count *= d
        if end - begin != count * size or end > len(body):
            fail("%s: bad data_offsets %s for shape %s" % (name, entry["data_offsets"], shape))
        values = struct.unpack_from("<%d%s" % (count, code), body, begin)
        tensors[name] = (dtype, shape, list(values))
        ranges.append((begin, end))
    covered = 0
    for begin, end in sorted(ranges):
        if begin != covered:
            fail("data section has a hole or overlap at byte %d" % begin)
        covered = end
    if covered != len(body):
        fail("data section has %d bytes, tensors cover %d" % (len(body), covered))
    return metadata, tensors


def main():
    path, model_path = sys.argv[1], sys.argv[2]
    metadata, tensors = read(path)
    state = torch.jit.load(model_path).state_dict()
    if sorted(tensors) != sorted(state):
        fail("names differ: file %s, model %s" % (sorted(tensors), sorted(state)))
    for name, (dtype, shape, values) in tensors.items():
        expected = state[name]
        if expected.dtype != dtype or list(expected.shape) != shape:
            fail("%s: file %s %s, model %s %s" % (name, dtype, shape, expected.dtype, list(expected.shape)))
        if expected.flatten().tolist() != values:
            fail("%s: values differ" % name)
    print("safetensors_reader: %d tensors identical to %s (metadata %s)" % (len(tensors), model_path, metadata))


if __name__ == "__main__":
    main()
