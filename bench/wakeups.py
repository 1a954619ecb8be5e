#!/usr/bin/env python3
"""Where a transaction's CPU goes behind each proxy: pgbench -S through pgmemo and through
PgBouncer, both in transaction pooling over 8 server connections, alternated, with per run:

- the proxy's CPU per transaction, split into user and system time (/proc/PID/stat), and its
  voluntary context switches (how often it slept in epoll_wait; /proc/PID/task/*/sched);
- the PostgreSQL backends' CPU per transaction (user, system, and the scheduler's exact run
  time), their voluntary and involuntary context switches and CPU migrations (/proc/PID/sched);
- TCP segments sent per transaction on the whole machine, and how many were pure ACKs or
  delayed ACKs (`nstat -az`): 4 means one segment per hop and no separate ACKs;
- the machine's user, system and softirq time per transaction (/proc/stat).

It answers "is PostgreSQL doing more work behind one proxy than behind the other, and why"
(more wake-ups, split packets, migrations), which tps ratios cannot. See bench/README.md.
Python 3 standard library; reuses bench/run.py's helpers. Needs PgBouncer and `nstat`
(iproute2).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as pt  # noqa: E402

TICK_US = 1e6 / os.sysconf("SC_CLK_TCK")


def sched(path):
    """(run time ns, migrations, voluntary switches, involuntary switches) of one task."""
    text = (path / "sched").read_text()

    def field(name):
        return float(re.search(rf"^{re.escape(name)}\s+:\s+([\d.]+)", text, re.M).group(1))

    return (field("se.sum_exec_runtime") * 1e6, field("se.nr_migrations"),
            field("nr_voluntary_switches"), field("nr_involuntary_switches"))


def utime_stime(path):
    fields = (path / "stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def backends():
    """Per PostgreSQL backend of the benchmark database: user, system ticks and sched()."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            if not cmd.startswith(b"postgres") or pt.DB.encode() not in cmd:
                continue
            out[d.name] = (*utime_stime(d), *sched(d))
        except (OSError, AttributeError):
            pass  # the process ended while being read
    return out


def proxy(pid):
    """The proxy's user, system ticks and voluntary switches over all its threads."""
    u, s = utime_stime(Path(f"/proc/{pid}"))
    switches = sum(sched(t)[2] for t in Path(f"/proc/{pid}/task").iterdir())
    return u, s, switches


def tcp():
    out = subprocess.run(["nstat", "-az"], capture_output=True, text=True, check=True).stdout
    counters = {}
    for line in out.splitlines()[1:]:
        f = line.split()
        if len(f) >= 2 and f[1].isdigit():
            counters[f[0]] = int(f[1])
    return counters


def machine():
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def measure(tools, name, target, clients, mode, duration):
    n0, b0, m0, p0 = tcp(), backends(), machine(), proxy(target.pid)
    out = subprocess.run(
        [tools["pgbench"], "-S", "-n", "-T", str(duration), "-c", str(clients), "-j", "2",
         "-M", mode, "-h", pt.PG_HOST, "-p", str(target.port), "-U", pt.PG_USER, pt.DB],
        capture_output=True, text=True, env=pt.pg_env())
    n1, b1, m1, p1 = tcp(), backends(), machine(), proxy(target.pid)
    done = re.search(r"number of transactions actually processed: (\d+)", out.stdout)
    tps = re.search(r"tps = ([\d.]+)", out.stdout)
    if out.returncode != 0 or not done or not tps:
        raise pt.BenchError(f"pgbench through {name} failed:\n{out.stdout}{out.stderr}")
    txns = int(done.group(1))
    pg = [0.0] * 6
    for pid, after in b1.items():
        before = b0.get(pid, (0,) * 6)
        pg = [acc + a - b for acc, a, b in zip(pg, after, before)]
    m = [a - b for a, b in zip(m1, m0)]

    def seg(key):
        return (n1.get(key, 0) - n0.get(key, 0)) / txns

    return {
        "tps": float(tps.group(1)),
        "proxy user": (p1[0] - p0[0]) * TICK_US / txns,
        "proxy sys": (p1[1] - p0[1]) * TICK_US / txns,
        "proxy sleeps": (p1[2] - p0[2]) / txns,
        "pg user": pg[0] * TICK_US / txns,
        "pg sys": pg[1] * TICK_US / txns,
        "pg run": pg[2] / 1e3 / txns,
        "pg migrations": pg[3] / txns,
        "pg sleeps": pg[4] / txns,
        "pg preempted": pg[5] / txns,
        "segments": seg("TcpOutSegs"),
        "pure acks": seg("TcpExtTCPPureAcks"),
        "delayed acks": seg("TcpExtDelayedACKs"),
        "machine user": m[0] * TICK_US / txns,
        "machine sys": m[2] * TICK_US / txns,
        "softirq": m[6] * TICK_US / txns,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pgmemo-bin", required=True, help="the pgmemo binary to run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=int, default=8, help="seconds per pgbench run")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--mode", default="simple", choices=pt.ALL_MODES)
    p.add_argument("--pool-size", type=int, default=8)
    args = p.parse_args()
    tools = {t: pt.find_tool(t) for t in ("pgbench", "psql")}
    bouncer = "/usr/sbin/pgbouncer"
    if not all(tools.values()) or not os.path.exists(bouncer):
        sys.exit("needs pgbench, psql and /usr/sbin/pgbouncer")
    pt.prepare_db(tools, 10)
    work = Path(tempfile.mkdtemp(prefix="pgmemo-wakeups-"))
    targets = {
        "pgmemo": pt.start_pgmemo(args.pgmemo_bin, args.pool_size, "transaction", work, 1,
                                  extra_args=["--cache", "off"]),
        "pgbouncer": pt.start_pgbouncer(bouncer, args.pool_size, "transaction", work),
    }
    rows = []
    try:
        for name, t in targets.items():
            t.wait_ready(tools)
            # Opens the pool's server connections and warms both ends; not recorded.
            measure(tools, name, t, args.clients, args.mode, 2)
        for r in range(args.rounds):
            order = list(targets) if r % 2 == 0 else list(reversed(targets))
            for name in order:
                pt.wait_for_slots(tools, args.pool_size + 2)
                row = measure(tools, name, targets[name], args.clients, args.mode,
                              args.duration)
                rows.append((r + 1, name, row))
                pt.log(f"round {r + 1} {name}: {row['tps']:,.0f} tps")
    finally:
        for t in targets.values():
            t.stop()
    keys = list(rows[0][2])
    print(f"pgbench -S -M {args.mode}, {args.clients} clients, pool of {args.pool_size}; "
          "µs or counts per transaction\n")
    print("| round | proxy | " + " | ".join(keys) + " |")
    print("|---|---|" + "---:|" * len(keys))
    for r, name, row in rows:
        cells = [f"{row[k]:,.0f}" if k == "tps" else f"{row[k]:.3f}" if row[k] < 2 else
                 f"{row[k]:.1f}" for k in keys]  # counts below 2 need the decimals
        print(f"| {r} | {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
