#!/usr/bin/env python3
"""Overlap soak: real nodes, real sessions, adversarial faults; measures how
long any session ran on two holders at once.

    scripts/soak-overlap.py [--seconds 120] [--nodes 3] [--seed 1] [--vandal] [--max-poll 5s]

Builds nothing: uses target/debug/leasehold (cargo build first). Runs on a
local directory store under a temporary directory, on this machine only.

Sessions (each records nothing itself; the soak finds them by the
LEASEHOLD_SESSION / LEASEHOLD_EPOCH / LEASEHOLD_NODE in their environment,
which every descendant inherits):
  plain    exec sleep
  escaper  a setsid grandchild and a double-forked one, then sleep
  reader   reads stdin in a loop, then sleep
  flood    writes 1 MiB, then sleeps

Faults, one every 0.5-2 s, drawn from the seed:
  kill      SIGKILL a node (restarted 1-3 s later)
  stop      SIGSTOP a node for 1-3 ttl, then SIGCONT
  term      SIGTERM a node (restarted 1-3 s later)
  watchdog  kill -9 one session watchdog
  twin      start a second instance of a live node id, through a URL
            variant (trailing slash, doubled slash) or another lock directory;
            it is killed after 2-4 s
With --vandal, also (as an operator with `rm` would, behind the store's back):
  rm-claim  delete a random sessions/<name> (a claim, a vanished marker)
  rm-node   delete a random nodes/<id> (a node record)

Every 20 ms the soak reads /proc: for each session, the set of distinct
(node, epoch) holders with a live process. More than one is an overlap; the
soak sums its duration. Exit status 1 if any overlap was seen.
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "debug", "leasehold")
TTL = "1s"


def sessions_alive():
    """{session: {(node, epoch)}} from every live process's environment."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(
                    kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv
                )
        except (OSError, IndexError):
            continue
        s = env.get(b"LEASEHOLD_SESSION")
        if s is None or b"LEASEHOLD_EPOCH" not in env:
            continue
        # The watchdog carries the session's environment too; it is the
        # holder's own process, not a second holder.
        out.setdefault(s.decode(), set()).add(
            (env.get(b"LEASEHOLD_NODE", b"?").decode(), env[b"LEASEHOLD_EPOCH"].decode())
        )
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vandal", action="store_true", help="also delete claims and node records")
    ap.add_argument("--max-poll", default=None,
                    help="the nodes' --max-poll (e.g. 5s: idle pauses past the ttl, so the ring watch runs)")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    tmp = tempfile.mkdtemp(prefix="leasehold-soak-")
    url = f"file://{tmp}/bucket"
    env = dict(os.environ, LEASEHOLD_LOCK_DIR=f"{tmp}/locks", LEASEHOLD_STATE_DIR=f"{tmp}/state")
    env.pop("LEASEHOLD_STORE", None)
    subprocess.run([BIN, "init", "--store", url], check=True, env=env, stdout=subprocess.DEVNULL)
    specs = {
        "plain": "exec sleep 1000",
        "escaper": "setsid sleep 1000 & (sleep 1000 &) ; exec sleep 1000",
        "reader": "while read l; do :; done; exec sleep 1000",
        "flood": "head -c 1048576 /dev/zero | tr '\\0' x; exec sleep 1000",
    }
    for i, (kind, script) in enumerate(list(specs.items()) * 2):
        path = f"{tmp}/{kind}{i}.json"
        with open(path, "w") as f:
            json.dump({"name": f"{kind}{i}", "spec": {"command": "sh", "args": ["-c", script], "restart": "always"}}, f)
        subprocess.run([BIN, "apply", path, "--store", url], check=True, env=env, stdout=subprocess.DEVNULL)

    def start(nid, store=url, extra_env=None):
        e = dict(env, **(extra_env or {}))
        log = open(f"{tmp}/{nid}-{time.time():.3f}.log", "w")
        extra = ["--max-poll", a.max_poll] if a.max_poll else []
        return subprocess.Popen(
            [BIN, "node", "run", "--store", store, "--id", nid, "--ttl", TTL, "--stop-grace", "300ms"] + extra,
            env=e, stdout=subprocess.DEVNULL, stderr=log,
        )

    nodes = {f"n{i}": start(f"n{i}") for i in range(a.nodes)}
    restart_at = {}
    resume_at = {}
    twins = []
    faults = {}
    overlap = 0.0
    worst = 0.0
    current = 0.0
    next_fault = time.time() + 3
    end = time.time() + a.seconds
    last = time.time()
    while time.time() < end:
        now = time.time()
        alive = sessions_alive()
        if any(len(h) > 1 for h in alive.values()):
            dt = now - last
            overlap += dt
            current += dt
            worst = max(worst, current)
            bad = {s: h for s, h in alive.items() if len(h) > 1}
            print(f"OVERLAP at +{now - (end - a.seconds):.2f}s: {bad}", file=sys.stderr)
        else:
            current = 0.0
        last = now
        for nid, t in list(restart_at.items()):
            if now >= t:
                nodes[nid] = start(nid)
                del restart_at[nid]
        for nid, t in list(resume_at.items()):
            if now >= t:
                os.kill(nodes[nid].pid, signal.SIGCONT)
                del resume_at[nid]
        for t in list(twins):
            if now >= t[1]:
                t[0].kill()
                t[0].wait()
                twins.remove(t)
        if now >= next_fault:
            next_fault = now + rng.uniform(0.5, 2.0)
            live = [n for n in nodes if n not in restart_at and n not in resume_at and nodes[n].poll() is None]
            kinds = ["kill", "stop", "term", "watchdog", "twin"]
            if a.vandal:
                kinds += ["rm-claim", "rm-node"]
            kind = rng.choice(kinds)
            if kind in ("kill", "stop", "term", "twin") and not live:
                continue
            nid = rng.choice(live) if live else None
            if kind == "kill":
                nodes[nid].kill()
                nodes[nid].wait()
                restart_at[nid] = now + rng.uniform(1, 3)
            elif kind == "term":
                nodes[nid].terminate()
                try:
                    nodes[nid].wait(timeout=10)
                except subprocess.TimeoutExpired:
                    nodes[nid].kill()
                    nodes[nid].wait()
                restart_at[nid] = now + rng.uniform(1, 3)
            elif kind == "stop":
                os.kill(nodes[nid].pid, signal.SIGSTOP)
                resume_at[nid] = now + rng.uniform(1, 3)
            elif kind == "watchdog":
                wds = [int(p) for p in os.listdir("/proc") if p.isdigit() and _is_watchdog(p, tmp)]
                if not wds:
                    continue
                os.kill(rng.choice(wds), signal.SIGKILL)
            elif kind in ("rm-claim", "rm-node"):
                d = f"{tmp}/bucket/" + ("sessions" if kind == "rm-claim" else "nodes")
                names = sorted(os.listdir(d)) if os.path.isdir(d) else []
                if not names:
                    continue
                try:
                    os.remove(os.path.join(d, rng.choice(names)))
                except FileNotFoundError:
                    continue
            elif kind == "twin":
                how = rng.choice(["slash", "double", "lockdir"])
                if how == "slash":
                    p = start(nid, store=url + "/")
                elif how == "double":
                    p = start(nid, store=url.replace("/bucket", "//bucket"))
                else:
                    p = start(nid, extra_env={"LEASEHOLD_LOCK_DIR": f"{tmp}/other-locks-{len(twins)}"})
                twins.append((p, now + rng.uniform(2, 4)))
            faults[kind] = faults.get(kind, 0) + 1
        time.sleep(0.02)
    for nid, t in resume_at.items():
        os.kill(nodes[nid].pid, signal.SIGCONT)
    for p in list(nodes.values()) + [t[0] for t in twins]:
        p.kill()
        p.wait()
    time.sleep(1.5)
    left = sessions_alive()
    print(
        f"soak {a.seconds:.0f} s, {a.nodes} nodes, 8 sessions, seed {a.seed}: "
        f"faults {dict(sorted(faults.items()))} ({sum(faults.values())}), "
        f"overlap {overlap * 1000:.0f} ms in all (longest {worst * 1000:.0f} ms), "
        f"session processes left after every node was killed: {sum(len(h) for h in left.values())}"
    )
    return 1 if overlap > 0 or left else 0


def _is_watchdog(pid, tmp):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            c = f.read()
        return b"__watchdog" in c and tmp.encode() in c
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
