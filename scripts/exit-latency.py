#!/usr/bin/env python3
"""Exit -> recorded status: how long after a session's process exits its
claim says so (issue #38's target: within 100 ms p99).

    scripts/exit-latency.py [--jobs 200] [--bin target/release/leasehold] [--json]

Builds nothing (cargo build --release first). One node on a local directory
store under a temporary directory, on this machine only, at the defaults
but for its capacity. Each job sleeps a random 0.2-3 s, writes this
machine's wall clock in nanoseconds to `end.<name>` (`date +%s%N`, the last
thing before it exits), and exits 0 under `restart: never`. The claim's
`updated_at_ms` is the node's wall clock when it wrote `succeeded`. The
latency is the difference: the shell's own exit after `date`, the watchdog
seeing it, the node hearing of it and the fenced write of the claim (on the
local store: a file written, fsynced and renamed) are all inside it. Both
stamps are this machine's wall clock, in milliseconds for the claim.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time


def claim(bucket, name):
    path = os.path.join(bucket, "sessions", name)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    # The local store's files start with a header line (etag, length,
    # checksum); the object's bytes follow.
    _, _, body = data.partition(b"\n")
    return json.loads(body)


def percentile(xs, p):
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--bin", default="target/release/leasehold")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    binary = os.path.abspath(a.bin)
    if not os.access(binary, os.X_OK):
        sys.exit(f"error: {binary} not found (cargo build --release first)")
    with tempfile.TemporaryDirectory() as d:
        # Sessions run as nobody on a node running as root: they write
        # their end stamps here.
        os.chmod(d, 0o1777)
        bucket = os.path.join(d, "bucket")
        url = f"file://{bucket}"
        env = dict(os.environ, LEASEHOLD_LOCK_DIR=os.path.join(d, "locks"),
                   LEASEHOLD_STATE_DIR=os.path.join(d, "state"))
        env.pop("LEASEHOLD_STORE", None)
        subprocess.run([binary, "init", "--store", url], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        log = open(os.path.join(d, "node.log"), "w")
        node = subprocess.Popen(
            [binary, "node", "run", "--store", url, "--id", "n1",
             "--capacity", str(a.jobs + 8)],
            env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            names = [f"j{i}" for i in range(a.jobs)]
            mf = os.path.join(d, "m.json")
            for n in names:
                nap = rng.uniform(0.2, 3.0)
                script = (f"sleep {nap:.3f}; date +%s%N > {d}/end.{n}; exit 0")
                with open(mf, "w") as f:
                    json.dump({"name": n, "spec": {
                        "command": "sh", "args": ["-c", script],
                        "restart": "never"}}, f)
                subprocess.run([binary, "apply", mf, "--store", url], env=env,
                               check=True, stdout=subprocess.DEVNULL)
            deadline = time.monotonic() + 120 + a.jobs * 0.2
            lat = {}
            while time.monotonic() < deadline and len(lat) < len(names):
                for n in names:
                    if n in lat:
                        continue
                    c = claim(bucket, n)
                    if c and c.get("state") == "succeeded":
                        with open(os.path.join(d, f"end.{n}")) as f:
                            end_ms = int(f.read().strip()) / 1e6
                        lat[n] = c["updated_at_ms"] - end_ms
                time.sleep(0.05)
            if len(lat) < len(names):
                sys.exit(f"error: only {len(lat)} of {len(names)} jobs recorded "
                         f"(node log: {open(os.path.join(d, 'node.log')).read()[-2000:]})")
        finally:
            node.terminate()
            node.wait(timeout=30)
    xs = list(lat.values())
    out = {
        "jobs": len(xs),
        "p50_ms": round(percentile(xs, 50), 1),
        "p90_ms": round(percentile(xs, 90), 1),
        "p99_ms": round(percentile(xs, 99), 1),
        "max_ms": round(max(xs), 1),
        "min_ms": round(min(xs), 1),
    }
    if a.json:
        print(json.dumps(out))
    else:
        print(f"exit -> recorded status over {out['jobs']} jobs: p50 {out['p50_ms']} ms, "
              f"p90 {out['p90_ms']} ms, p99 {out['p99_ms']} ms, max {out['max_ms']} ms "
              f"(min {out['min_ms']} ms)")


if __name__ == "__main__":
    main()
