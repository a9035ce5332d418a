"""What the stable ABI costs: the same tree's extension built for one interpreter (cp312) and for
the stable ABI (cp312-abi3), each installed in its own venv of the same Python, timed in
interleaved rounds (thread CPU time, medians): the per-call cost of bound calls (a length, a
record as a dict, a sample's bytes) and `stoker.verify`'s decode rate on one thread. A loader's
batch crosses the bindings once, so the per-call figures bound what the ABI can cost it.

    python benchmarks/abi3.py PACK VENV_PYTHON_ABI3 VENV_PYTHON_CP312 [--rounds 9]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess

ROUND = r"""
import json, sys, time
import stoker
from stoker import _core
ds = _core.Dataset.open(sys.argv[1])

def per_call(fn, reps):
    t = time.thread_time()
    for _ in range(reps):
        fn()
    return (time.thread_time() - t) / reps * 1e9

calls = {"len(ds)": per_call(lambda: len(ds), 200_000),
         "ds.record(7)": per_call(lambda: ds.record(7), 50_000),
         "ds.read(7)": per_call(lambda: ds.read(7), 50_000)}
c0 = time.process_time()
report = stoker.verify(sys.argv[1], threads=1, progress=False)
print(json.dumps({"ns": calls, "verify": report.checked / (time.process_time() - c0),
                  "core": _core.__file__}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pack")
    parser.add_argument("abi3_python")
    parser.add_argument("cp312_python")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    pythons = {"abi3": args.abi3_python, "cp312": args.cp312_python}
    rows: dict[str, list[dict]] = {name: [] for name in pythons}
    for _ in range(args.rounds):
        for name, python in pythons.items():
            out = subprocess.run([python, "-c", ROUND, args.pack], capture_output=True,
                                 text=True, check=True)  # fmt: skip
            rows[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    for name, runs in rows.items():
        ns = {k: statistics.median(r["ns"][k] for r in runs) for k in runs[0]["ns"]}
        verify = statistics.median(r["verify"] for r in runs)
        calls = ", ".join(f"{k} {v:,.0f} ns" for k, v in ns.items())
        print(f"{name} ({runs[0]['core'].rsplit('/', 1)[-1]}): {calls}; verify {verify:,.0f} "
              "images per CPU second")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
