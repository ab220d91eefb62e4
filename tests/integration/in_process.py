"""Runs one of the repository's python scripts (examples/*/make_model.py,
examples/fashion_mnist/make_node_data_by_hand.py) inside the calling test's interpreter instead of
a new one: the test has imported torch already, and a new interpreter would import it again
(~1.5 s of CPU per script, several per test; the suite is CPU-bound).

The script is loaded as a module under a name of its own (registered in sys.modules, so
TorchScript finds its classes' source) and its main() runs with sys.argv set to the given
arguments, its stdout discarded as the tests did with the subprocess, its torch RNG use forked
away from the caller's. A non-zero exit raises with what the script printed.
"""
import contextlib
import importlib.util
import io
import os
import sys

import torch

_loaded = {}


def _module(path):
    if path not in _loaded:
        name = f"cairn_script_{len(_loaded)}_{os.path.splitext(os.path.basename(path))[0]}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        sys.path.insert(0, os.path.dirname(path))  # as `python3 path` would have it
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(os.path.dirname(path))
        _loaded[path] = module
    return _loaded[path]


def run_script(path, args):
    """`python3 path args...`, in this process; returns what it printed."""
    path = os.path.abspath(path)
    module = _module(path)
    saved, sys.argv = sys.argv, [path] + [str(a) for a in args]
    out = io.StringIO()
    try:
        with torch.random.fork_rng(devices=[]), contextlib.redirect_stdout(out):
            module.main()
    except SystemExit as e:
        if e.code not in (None, 0):
            raise RuntimeError(f"{path} {' '.join(map(str, args))} exited with {e.code}:\n"
                               f"{out.getvalue()}") from None
    finally:
        sys.argv = saved
    return out.getvalue()
