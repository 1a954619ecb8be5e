#!/usr/bin/env python3
"""Result-cache benchmark: direct PostgreSQL, pgmemo with the cache off and on, Pgpool-II's
shared-memory query cache and nullpg (the do-nothing server), side by side in one run.

Workloads: a hot set of 2,000 rows (simple and prepared), lookups over all rows (mostly misses),
an aggregation over the whole table (1 and N clients), a 90% read / 10% write mix on the hot set,
and the latency of the aggregation the first time against repeated. Runs are interleaved (every
target back to back for each workload, the order rotated per round); the report (medians over
rounds, with tps, mean and p99 latency, hit ratio, proxy CPU per transaction, ratios to direct
and to nullpg, and the bars as pass/fail) is printed as Markdown and written to
bench/results/cache-<timestamp>.md. See bench/README.md. Python 3 standard library only.
"""

import argparse
import collections
import datetime
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no bench/__pycache__ from importing run.py
sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as passthrough  # noqa: E402  (bench/run.py: tools, proxies, CPU, report helpers)
from run import BenchError, fmt, log, med  # noqa: E402

ROOT = passthrough.ROOT
PG_HOST, PG_PORT, PG_USER, DB = passthrough.PG_HOST, passthrough.PG_PORT, passthrough.PG_USER, passthrough.DB

# Build outputs go to a target directory of their own, next to the checkout, so that the
# benchmark's release build does not contend for the build lock of a developer's `target/`.
DEFAULT_TARGET_DIR = ROOT.parent / "target-bench"
DEFAULT_NULLPG_SRC = ROOT.parent / "shared" / "tools" / "nullpg"

ALL_TARGETS = ("direct", "pgmemo-off", "pgmemo-on", "pgpool", "nullpg")
PROXIES = ("pgmemo-off", "pgmemo-on", "pgpool", "nullpg")  # the processes the script starts

HOT_ROWS = 2000

# pgbench scripts. nullpg answers every query with one canned row, so only custom scripts (-f)
# run against it; the builtin ones query catalog tables first.
SCRIPTS = {
    "hot": f"\\set aid random(1, {HOT_ROWS})\n"
           "select abalance from pgbench_accounts where aid = :aid;\n",
    "all": "\\set aid random(1, 100000 * :scale)\n"
           "select abalance from pgbench_accounts where aid = :aid;\n",
    "agg": "select bid, sum(abalance) from pgbench_accounts group by bid;\n",
    "write": f"\\set aid random(1, {HOT_ROWS})\n"
             "update pgbench_accounts set abalance = abalance + 1 where aid = :aid;\n",
}

# key, title, scripts as (name, weight), clients (None: --clients), -M mode, whether nullpg runs it
Workload = collections.namedtuple("Workload", "key title scripts clients mode nullpg")
WORKLOAD_KEYS = ("latency", "hot-simple", "hot-prepared", "miss-simple", "miss-prepared",
                 "agg-1", "agg-n", "mix")

# The bars from the issue: (workload, target, reference target, least ratio), CPU per hit.
HIT_RATIO_BAR = 0.90
MISS_RATIO_BAR = 0.95
AGG_RATIO_BAR = 0.90
HIT_CPU_BAR_US = 10.0

# CPU per transaction is left out (—) when the server used fewer clock ticks than this during the
# run: at a few transactions per second (the aggregation through PostgreSQL) one tick more or
# less would change it many times over.
MIN_CPU_TICKS = 5


def workloads(clients):
    """The throughput workloads, in the order they run in each round."""
    n = clients
    return [
        Workload("hot-simple", f"hot set ({HOT_ROWS:,} rows), {n} clients, -M simple",
                 (("hot", 1),), n, "simple", True),
        Workload("hot-prepared", f"hot set ({HOT_ROWS:,} rows), {n} clients, -M prepared",
                 (("hot", 1),), n, "prepared", True),
        Workload("miss-simple", f"lookups over all rows (mostly misses), {n} clients, -M simple",
                 (("all", 1),), n, "simple", True),
        Workload("miss-prepared", f"lookups over all rows (mostly misses), {n} clients, -M prepared",
                 (("all", 1),), n, "prepared", True),
        Workload("agg-1", "aggregation `group by bid`, 1 client, -M simple",
                 (("agg", 1),), 1, "simple", True),
        Workload("agg-n", f"aggregation `group by bid`, {n} clients, -M simple",
                 (("agg", 1),), n, "simple", True),
        Workload("mix", f"90% hot-set reads / 10% updates of the same rows, {n} clients, -M simple",
                 (("hot", 9), ("write", 1)), n, "simple", False),
    ]


# ---------------------------------------------------------------------------------------------
# Binaries

def cargo_build(cmd, target_dir, what):
    """Runs a cargo build with CARGO_TARGET_DIR=target_dir; returns True when it succeeded."""
    log(f"building {what}: {' '.join(cmd)} (CARGO_TARGET_DIR={target_dir})")
    env = dict(os.environ, CARGO_TARGET_DIR=str(target_dir))
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=env)
    except OSError as e:
        log(f"warning: cannot run cargo: {e}")
        return False
    if r.returncode != 0:
        log(f"warning: building {what} failed (status {r.returncode})")
    return r.returncode == 0


def resolve_pgmemo(args):
    """Path of the pgmemo binary, built unless --no-build or --pgmemo-bin; None if unusable."""
    if args.pgmemo_bin:
        binary = Path(args.pgmemo_bin)
    else:
        binary = args.target_dir / "release" / "pgmemo"
        if not args.no_build:
            ok = cargo_build(["cargo", "build", "--release", "-p", "pgmemo"], args.target_dir, "pgmemo")
            if not ok and binary.exists():
                log(f"warning: using the existing {binary}")
    return binary if os.access(binary, os.X_OK) else None


def resolve_nullpg(args):
    """(path of nullpg or None, why not). Built into TARGET_DIR/nullpg unless --no-build."""
    if args.nullpg_bin:
        binary = Path(args.nullpg_bin)
        return (binary, "") if os.access(binary, os.X_OK) else (None, f"{binary} is not executable")
    target_dir = args.target_dir / "nullpg"
    binary = target_dir / "release" / "nullpg"
    manifest = args.nullpg_src / "Cargo.toml"
    if not args.no_build and manifest.exists():
        cargo_build(["cargo", "build", "--release", "--manifest-path", str(manifest)], target_dir,
                    "nullpg")
    if os.access(binary, os.X_OK):
        return binary, ""
    if not manifest.exists():
        return None, f"nullpg not found ({args.nullpg_src})"
    return None, f"{binary} missing (drop --no-build?)"


def find_pgpool():
    """Path of Pgpool-II's `pgpool`, or None."""
    path = shutil.which("pgpool")
    if path:
        return path
    return "/usr/sbin/pgpool" if os.access("/usr/sbin/pgpool", os.X_OK) else None


# ---------------------------------------------------------------------------------------------
# Servers

def session_cpu_ticks(sid):
    """utime + stime of every process in session `sid` (a multi-process server such as Pgpool-II
    started with start_new_session), plus the leader's reaped children, in clock ticks."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[3]) != sid:  # field 6 of proc(5): session id
            continue
        total += int(fields[11]) + int(fields[12])
        if int(entry) == sid:
            total += int(fields[13]) + int(fields[14])  # cutime + cstime
    return total


class Server:
    """Something pgbench connects to: a port, and the process we started (None for direct).

    `kind` says how to read its cache counters: "pgmemo" (admin console `SHOW CACHE`), "pgpool"
    (`SHOW pool_cache`) or None."""

    def __init__(self, name, port, proxy=None, kind=None, multiprocess=False):
        self.name, self.port, self.proxy, self.kind = name, port, proxy, kind
        self.multiprocess = multiprocess

    def check_alive(self):
        if self.proxy:
            self.proxy.check_alive()

    def cpu_ticks(self):
        """CPU ticks used so far by the server's process(es), None for direct."""
        if not self.proxy:
            return None
        if self.multiprocess:
            return session_cpu_ticks(self.proxy.pid)
        return passthrough.cpu_ticks(self.proxy.pid)

    def cache_counters(self, tools):
        """(hits, misses) so far, or None when unknown (no cache, command missing or failed)."""
        if self.kind == "pgmemo":
            table = query_table(tools, self.port, "pgmemo", "SHOW CACHE")
            return counters_from_table(table, ("hits", "cache_hits"), ("misses", "cache_misses"))
        if self.kind == "pgpool":
            table = query_table(tools, self.port, DB, "SHOW pool_cache")
            return counters_from_table(table, ("num_cache_hits",), ("num_selects",))
        return None

    def stop(self):
        if self.proxy:
            self.proxy.stop()


class PgpoolProxy(passthrough.Proxy):
    """Pgpool-II: a parent with child processes; stopped with SIGINT (fast shutdown)."""

    def stop(self):
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.pid, signal.SIGKILL)
                self.popen.wait()


def start_nullpg(binary, workdir):
    """Starts nullpg on a free port."""
    port = passthrough.free_port()
    logfile = workdir / "nullpg.log"
    with open(logfile, "wb") as out:
        popen = subprocess.Popen([str(binary), f"127.0.0.1:{port}"], stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 cwd=workdir, start_new_session=True)
    return passthrough.Proxy("nullpg", popen, port, logfile)


def pgpool_conf(d, port, pcp_port, children):
    """pgpool.conf for one backend (the local server) in raw mode with the shared-memory cache."""
    return f"""\
backend_clustering_mode = 'raw'
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{d}'
pcp_listen_addresses = ''
pcp_port = {pcp_port}
pcp_socket_dir = '{d}'
backend_hostname0 = '{PG_HOST}'
backend_port0 = {PG_PORT}
backend_weight0 = 1
backend_flag0 = 'DISALLOW_TO_FAILOVER'
enable_pool_hba = off
num_init_children = {children}
max_pool = 1
connection_life_time = {passthrough.SERVER_IDLE_TIMEOUT_S}
log_destination = 'stderr'
pid_file_name = '{d}/pgpool.pid'
logdir = '{d}'
load_balance_mode = off
sr_check_period = 0
health_check_period = 0
use_watchdog = off
memory_cache_enabled = on
memqcache_method = 'shmem'
memqcache_total_size = 64MB
memqcache_expire = 0
memqcache_auto_cache_invalidation = on
memqcache_oiddir = '{d}/oiddir'
"""


def start_pgpool(binary, clients, workdir):
    """Starts Pgpool-II from a config in workdir/pgpool (as `postgres` when we are root)."""
    port, pcp_port = passthrough.free_port(), passthrough.free_port()
    d = workdir / "pgpool"
    (d / "oiddir").mkdir(parents=True)
    # pgbench's clients, plus a few for psql (readiness check, SHOW pool_cache).
    (d / "pgpool.conf").write_text(pgpool_conf(d, port, pcp_port, clients + 4))
    (d / "pcp.conf").write_text("")
    kwargs = {}
    if os.geteuid() == 0:
        import pwd
        pw = pwd.getpwnam("postgres")
        for parent in (workdir.parent, workdir):
            os.chmod(parent, 0o711)
        for p in [d, *d.rglob("*")]:
            os.chown(p, pw.pw_uid, pw.pw_gid)
        kwargs = dict(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
    logfile = d / "stderr.log"
    with open(logfile, "wb") as out:
        popen = subprocess.Popen([binary, "-n", "-f", str(d / "pgpool.conf"), "-F", str(d / "pcp.conf")],
                                 stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 cwd=d, start_new_session=True, **kwargs)
    return PgpoolProxy("pgpool", popen, port, logfile)


def start_server(name, setup, args, workdir):
    """Starts target `name` (see ALL_TARGETS) and waits until a query goes through."""
    if name == "direct":
        return Server("direct", PG_PORT)
    if name in ("pgmemo-off", "pgmemo-on"):
        extra = ["--cache", name.split("-")[1]] if setup["cache_flag"] else []
        proxy = passthrough.start_pgmemo(setup["pgmemo"], args.pool_size or args.clients,
                                         args.pool_mode, workdir,
                                         args.pgmemo_workers, extra_args=extra, name=name)
        server = Server(name, proxy.port, proxy, kind="pgmemo")
    elif name == "pgpool":
        proxy = start_pgpool(setup["pgpool"], args.clients, workdir)
        server = Server(name, proxy.port, proxy, kind="pgpool", multiprocess=True)
    elif name == "nullpg":
        proxy = start_nullpg(setup["nullpg"], workdir)
        server = Server(name, proxy.port, proxy)
    else:
        raise ValueError(name)
    try:
        proxy.wait_ready(setup["tools"])
    except BenchError:
        proxy.stop()
        raise
    log(f"{name} ready on port {proxy.port} (pid {proxy.pid})")
    return server


# ---------------------------------------------------------------------------------------------
# Measuring

def query_table(tools, port, db, sql):
    """Runs one statement with psql; returns (lower-cased column names, rows) or None on failure."""
    try:
        r = subprocess.run(
            [tools["psql"], "-X", "-A", "-F", "\t", "-P", "footer=off", "-h", PG_HOST,
             "-p", str(port), "-U", PG_USER, "-d", db, "-c", sql],
            capture_output=True, text=True, env=passthrough.pg_env(), timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = r.stdout.splitlines()
    if r.returncode != 0 or not lines:
        return None
    columns = [c.strip().lower() for c in lines[0].split("\t")]
    return columns, [line.split("\t") for line in lines[1:]]


def to_int(text):
    try:
        return int(float(text.strip()))
    except (ValueError, AttributeError):
        return None


def counters_from_table(table, hit_names, miss_names):
    """(hits, misses) from a SHOW result, or None. Accepts one column per counter (summed over
    the rows, or only a `total` row when there is one) or name/value rows."""
    if not table:
        return None
    columns, rows = table
    hit_col = next((columns.index(n) for n in hit_names if n in columns), None)
    miss_col = next((columns.index(n) for n in miss_names if n in columns), None)
    if hit_col is not None and miss_col is not None:
        totals = [r for r in rows if r and r[0].strip().lower() in ("total", "all", "*")]
        hits = misses = 0
        for row in totals or rows:
            if len(row) <= max(hit_col, miss_col):
                continue
            h, m = to_int(row[hit_col]), to_int(row[miss_col])
            if h is None or m is None:
                return None
            hits, misses = hits + h, misses + m
        return hits, misses
    # name/value layout: a row whose first cell names the counter, the value in the last cell
    found = {}
    for row in rows:
        if len(row) >= 2:
            key = row[0].strip().lower()
            if key in hit_names or key in miss_names:
                found["hits" if key in hit_names else "misses"] = to_int(row[-1])
    if found.get("hits") is not None and found.get("misses") is not None:
        return found["hits"], found["misses"]
    return None


def percentile(sorted_values, q):
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return None
    k = max(0, math.ceil(q / 100 * len(sorted_values)) - 1)
    return sorted_values[k]


def read_latencies(logdir):
    """Per-transaction latencies (µs) from pgbench --log files; failed or skipped transactions
    are left out. pgbench reads the clock lazily, so a transaction answered within one pass of
    its event loop (tens of µs) may be logged shorter than it was: fine for the tail (p99),
    which is why the mean comes from pgbench's own `latency average`."""
    out = []
    for path in sorted(logdir.iterdir()):
        with open(path) as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 3 and fields[2].isdigit():
                    out.append(int(fields[2]))
    return out


def pgbench_cmd(tools, server, wl, scripts, scale, log_prefix, duration=None, transactions=None):
    """The pgbench command line for workload `wl` against `server`."""
    clients = wl.clients
    cmd = [tools["pgbench"], "-n", "-c", str(clients), "-j", str(min(clients, 2)), "-M", wl.mode,
           "-s", str(scale), "--log", f"--log-prefix={log_prefix}",
           "-h", PG_HOST, "-p", str(server.port), "-U", PG_USER]
    cmd += ["-T", str(duration)] if duration else ["-t", str(transactions)]
    for name, weight in wl.scripts:
        cmd += ["-f", f"{scripts[name]}@{weight}"]
    return cmd + [DB]


def run_pgbench(tools, server, wl, scripts, scale, logdir, duration=None, transactions=None):
    """Runs one pgbench and measures it: tps, mean and p99 latency from the per-transaction log,
    the server's CPU time and cache hits during the run."""
    shutil.rmtree(logdir, ignore_errors=True)
    logdir.mkdir(parents=True)
    cmd = pgbench_cmd(tools, server, wl, scripts, scale, logdir / "txn", duration, transactions)
    server.check_alive()
    counters_before = server.cache_counters(tools)
    cpu_before = server.cpu_ticks()
    r = subprocess.run(cmd, capture_output=True, text=True, env=passthrough.pg_env(),
                       timeout=(duration or 60) + 300)
    cpu_after = server.cpu_ticks()
    counters_after = server.cache_counters(tools)
    out = r.stdout + r.stderr

    def grab(pattern):
        m = re.search(pattern, out)
        return float(m.group(1)) if m else None

    ordered = sorted(read_latencies(logdir))
    shutil.rmtree(logdir, ignore_errors=True)
    res = {
        "ok": r.returncode == 0,
        "txns": grab(r"number of transactions actually processed: (\d+)"),
        "failed": grab(r"number of failed transactions: (\d+)"),
        "tps": grab(r"tps = ([\d.]+) \(without initial connection time\)") or grab(r"tps = ([\d.]+)"),
        "lat_ms": grab(r"latency average = ([\d.]+) ms"),
        "p99_ms": percentile(ordered, 99) / 1000 if ordered else None,
        "cpu_s": None, "cpu_us_txn": None, "hits": None, "misses": None, "hit_ratio": None,
    }
    if res["ok"] and (res["tps"] is None or not res["txns"]):
        res["ok"] = False
    if not res["ok"]:
        lines = out.strip().splitlines() or ["(no output)"]
        res["error"] = "\n".join(dict.fromkeys([lines[0][:300], lines[-1][:300]]))
        return res
    if cpu_before is not None:
        ticks = cpu_after - cpu_before
        res["cpu_s"] = ticks / passthrough.CLK_TCK
        if ticks >= MIN_CPU_TICKS:  # fewer are mostly rounding (a tick is 10 ms)
            res["cpu_us_txn"] = res["cpu_s"] * 1e6 / res["txns"]
    if counters_before and counters_after:
        res["hits"] = counters_after[0] - counters_before[0]
        res["misses"] = counters_after[1] - counters_before[1]
        looked_up = res["hits"] + res["misses"]
        res["hit_ratio"] = res["hits"] / looked_up if looked_up > 0 else None
    return res


def run_latency(tools, server, repeats):
    """The aggregation on one psql connection with `\\timing`, 1 + repeats times, on a server
    that just started: the first execution's time against the median of the repeats."""
    cmd = [tools["psql"], "-X", "-q", "-A", "-t", "-h", PG_HOST, "-p", str(server.port),
           "-U", PG_USER, "-d", DB, "-c", "\\timing on"]
    cmd += ["-c", SCRIPTS["agg"].strip().rstrip(";")] * (repeats + 1)
    server.check_alive()
    r = subprocess.run(cmd, capture_output=True, text=True, env=passthrough.pg_env(), timeout=600)
    times = [float(t) for t in re.findall(r"^Time: ([\d.]+) ms", r.stdout, re.MULTILINE)]
    res = {"ok": r.returncode == 0 and len(times) == repeats + 1}
    if not res["ok"]:
        lines = (r.stderr.strip() or f"psql printed {len(times)} timings").splitlines()
        res["error"] = lines[-1][:300]
        return res
    res["first_ms"], res["repeat_ms"] = times[0], med(times[1:])
    return res


# ---------------------------------------------------------------------------------------------
# Report

def paired_ratio(per_target, a, b):
    """Median over rounds of tps(a) / tps(b) in the same round, or None."""
    ra = {rnd: r for rnd, r in per_target.get(a, []) if r["ok"]}
    rb = {rnd: r for rnd, r in per_target.get(b, []) if r["ok"]}
    return med([ra[i]["tps"] / rb[i]["tps"] for i in sorted(set(ra) & set(rb)) if rb[i]["tps"]])


def median_of(per_target, target, field):
    return med([r[field] for _, r in per_target.get(target, []) if r["ok"]])


def workload_table(wl, per_target, targets):
    """Markdown table of one workload: medians over rounds per target."""
    lines = [f"## {wl.title}", "",
             "| target | tps | mean ms | p99 ms | × direct | × nullpg | hit ratio | CPU µs/txn | spread | runs ok |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for t in targets:
        runs = per_target.get(t)
        if not runs:
            continue
        ok = [r for _, r in runs if r["ok"]]
        tps = [r["tps"] for r in ok]
        m_tps = med(tps)
        spread = (max(tps) - min(tps)) / m_tps * 100 if len(tps) > 1 and m_tps else None
        hit = median_of(per_target, t, "hit_ratio")
        lines.append(
            f"| {t} | {fmt(m_tps, ',.0f')} | {fmt(median_of(per_target, t, 'lat_ms'), '.3f')} "
            f"| {fmt(median_of(per_target, t, 'p99_ms'), '.3f')} "
            f"| {fmt(paired_ratio(per_target, t, 'direct') if t != 'direct' else None, '.3f')} "
            f"| {fmt(paired_ratio(per_target, t, 'nullpg') if t != 'nullpg' else None, '.3f')} "
            f"| {'n/a' if hit is None else f'{hit * 100:.1f}%'} "
            f"| {fmt(median_of(per_target, t, 'cpu_us_txn'), '.1f')} "
            f"| {fmt(spread, '.1f') + '%' if spread is not None else '—'} | {len(ok)}/{len(runs)} |")
    return lines + [""]


def latency_table(per_target, targets, repeats):
    """Markdown table of the first-against-repeated latency step."""
    lines = ["## Aggregation latency, first execution against repeated", "",
             f"On servers started fresh each round: one psql connection runs the aggregation "
             f"{repeats + 1} times, timed by psql's `\\timing`. `first`: the first execution; "
             f"`repeated`: the median of the other {repeats}. Medians over rounds.", "",
             "| target | first ms | repeated ms | first / repeated | runs ok |",
             "|---|---:|---:|---:|---:|"]
    for t in targets:
        runs = per_target.get(t)
        if not runs:
            continue
        ok = [r for _, r in runs if r["ok"]]
        first, rep = med([r["first_ms"] for r in ok]), med([r["repeat_ms"] for r in ok])
        ratio = first / rep if first and rep else None
        lines.append(f"| {t} | {fmt(first, '.3f')} | {fmt(rep, '.3f')} | {fmt(ratio, '.1f')} "
                     f"| {len(ok)}/{len(runs)} |")
    return lines + [""]


def judge(value, ok):
    return "n/a" if value is None else ("pass" if ok(value) else "FAIL")


def bars(results):
    """The issue's bars: list of (bar, measured, needed, verdict)."""
    out = []
    for key, mode in (("hot-simple", "simple"), ("hot-prepared", "prepared")):
        per = results.get(key, {})
        ratio = paired_ratio(per, "pgmemo-on", "nullpg")
        out.append((f"cache hits, -M {mode}: pgmemo-on tps / nullpg tps", fmt(ratio, ".3f"),
                    f"≥ {HIT_RATIO_BAR:.2f}", judge(ratio, lambda v: v >= HIT_RATIO_BAR)))
        cpu = median_of(per, "pgmemo-on", "cpu_us_txn")
        out.append((f"cache hits, -M {mode}: pgmemo CPU µs per hit (hot set, CPU µs/txn)",
                    fmt(cpu, ".1f"), f"< {HIT_CPU_BAR_US:.0f}", judge(cpu, lambda v: v < HIT_CPU_BAR_US)))
    for key, mode in (("miss-simple", "simple"), ("miss-prepared", "prepared")):
        ratio = paired_ratio(results.get(key, {}), "pgmemo-on", "pgmemo-off")
        out.append((f"mostly misses, -M {mode}: pgmemo-on tps / pgmemo-off tps", fmt(ratio, ".3f"),
                    f"≥ {MISS_RATIO_BAR:.2f}", judge(ratio, lambda v: v >= MISS_RATIO_BAR)))
    ratio = paired_ratio(results.get("agg-1", {}), "pgmemo-on", "nullpg")
    out.append(("aggregation, 1 client: pgmemo-on tps / nullpg tps", fmt(ratio, ".3f"),
                f"≥ {AGG_RATIO_BAR:.2f}", judge(ratio, lambda v: v >= AGG_RATIO_BAR)))
    return out


def runs_table(runs):
    """Every run, in the order they ran."""
    lines = ["## Runs", "",
             "| round | workload | target | tps | mean ms | p99 ms | txns | hits | misses "
             "| proxy CPU s | CPU µs/txn | note |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for run in runs:
        r = run["res"]
        note = "" if r["ok"] else "FAILED: " + r.get("error", "").replace("\n", " / ").replace("|", "\\|")
        if r["ok"] and r.get("failed"):
            note = f"{r['failed']:.0f} failed transactions"
        if r["ok"] and "first_ms" in r:
            note = f"first {r['first_ms']:.3f} ms, repeated {r['repeat_ms']:.3f} ms"
        lines.append(f"| {run['round'] + 1} | {run['workload']} | {run['target']} "
                     f"| {fmt(r.get('tps'), ',.0f')} | {fmt(r.get('lat_ms'), '.3f')} "
                     f"| {fmt(r.get('p99_ms'), '.3f')} | {fmt(r.get('txns'), '.0f')} "
                     f"| {fmt(r.get('hits'), 'd')} | {fmt(r.get('misses'), 'd')} "
                     f"| {fmt(r.get('cpu_s'), '.2f')} | {fmt(r.get('cpu_us_txn'), '.1f')} | {note} |")
    return lines + [""]


def build_report(meta, targets, selected, results, repeats):
    """The whole report as Markdown."""
    lines = [f"# pgmemo result-cache benchmark, {meta['when']}", ""]
    lines += [f"- {k}: {v}" for k, v in meta["info"].items()]
    lines += ["", "Targets:", ""]
    lines += [f"- {t}: {meta['targets'][t]}" for t in ALL_TARGETS if t in meta["targets"]]
    lines += ["",
              "Medians over rounds. `mean ms`: pgbench's `latency average`; `p99 ms`: the 99th "
              "percentile of the latencies in pgbench's per-transaction log (`--log`). "
              "`× direct`, `× nullpg`: the median over rounds of tps / that target's tps in the same "
              "round. `hit ratio`: hits / (hits + misses) during the run, from pgmemo's `SHOW CACHE` "
              "or Pgpool-II's `SHOW pool_cache` (n/a when the command is missing or failed). "
              "`CPU µs/txn`: the server process's CPU time (user + system; all of Pgpool-II's "
              "processes) during the run divided by the transactions pgbench processed. `spread`: "
              "(max − min) / median of tps over rounds.", ""]
    if "latency" in selected:
        lines += latency_table(results.get("latency", {}), targets, repeats)
    for wl in meta["workloads"]:
        lines += workload_table(wl, results.get(wl.key, {}), targets)
    lines += ["## The bars", "",
              "Judged on a full run (3 rounds of 8 s or more), not on a quick one; n/a when a target "
              "it needs did not run.", "",
              "| bar | measured | needed | result |", "|---|---:|---:|---|"]
    lines += [f"| {b} | {m} | {n} | {v} |" for b, m, n, v in bars(results)]
    lines.append("")
    lines += runs_table(meta["runs"])
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Driving the run

def parse_args():
    def name_list(allowed):
        def parse(s):
            v = [x.strip() for x in s.split(",") if x.strip()]
            bad = [x for x in v if x not in allowed]
            if bad or not v:
                raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {','.join(allowed)}")
            return list(dict.fromkeys(v))
        return parse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    p.add_argument("--duration", type=int, default=8, help="seconds per pgbench run")
    p.add_argument("--clients", type=int, default=8, help="pgbench clients of the multi-client workloads")
    p.add_argument("--scale", type=int, default=10, help="pgbench scale of the database")
    p.add_argument("--pool-mode", choices=("session", "transaction"), default="session",
                   help="pgmemo's pool mode (in transaction mode a hit takes no server connection)")
    p.add_argument("--pool-size", type=int, default=0,
                   help="pgmemo's server connections (default: --clients)")
    p.add_argument("--repeats", type=int, default=20,
                   help="repeated executions after the first in the latency step")
    p.add_argument("--targets", type=name_list(ALL_TARGETS), default=",".join(ALL_TARGETS),
                   help="what pgbench connects to")
    p.add_argument("--workloads", type=name_list(WORKLOAD_KEYS), default=",".join(WORKLOAD_KEYS),
                   help="which workloads run")
    p.add_argument("--target-dir", type=Path, default=DEFAULT_TARGET_DIR,
                   help="CARGO_TARGET_DIR of the benchmark's builds (pgmemo, and nullpg under nullpg/)")
    p.add_argument("--pgmemo-bin", help="use this pgmemo binary (no build)")
    p.add_argument("--nullpg-src", type=Path, default=DEFAULT_NULLPG_SRC, help="nullpg's source")
    p.add_argument("--nullpg-bin", help="use this nullpg binary (no build)")
    p.add_argument("--no-build", action="store_true", help="use existing binaries, build nothing")
    # pgmemo's own default, one worker per core: nullpg, the ceiling for hits, runs two
    # worker threads, so a one-thread pgmemo would be measured against a wider server.
    p.add_argument("--pgmemo-workers", type=int, default=0,
                   help="pgmemo --worker-threads (default 0: one per core, pgmemo's default)")
    p.add_argument("--synchronous-commit", choices=("on", "off"), default="off",
                   help="synchronous_commit of the benchmark database (ALTER DATABASE): off keeps "
                        "the disk's fsync latency out of the read/write mix")
    a = p.parse_args()
    if min(a.rounds, a.duration, a.clients, a.scale, a.repeats) < 1:
        p.error("--rounds, --duration, --clients, --scale and --repeats must be ≥ 1")
    a.target_dir = a.target_dir.resolve()
    return a


def resolve_targets(args, tools):
    """Which targets can run. Returns (setup: binaries and flags, status: target -> description,
    runnable targets in ALL_TARGETS order)."""
    setup = {"tools": tools, "cache_flag": False}
    status = {t: "ran" for t in args.targets}
    if any(t.startswith("pgmemo") for t in args.targets):
        setup["pgmemo"] = resolve_pgmemo(args)
        if not setup["pgmemo"]:
            for t in ("pgmemo-off", "pgmemo-on"):
                if t in status:
                    status[t] = "skipped: no pgmemo binary (drop --no-build or give --pgmemo-bin)"
        else:
            setup["cache_flag"] = passthrough.pgmemo_has_cache_flag(setup["pgmemo"])
            if setup["cache_flag"]:
                for t in ("pgmemo-off", "pgmemo-on"):
                    if t in status:
                        status[t] = f"ran with `--cache {t.split('-')[1]}`"
            else:
                log("warning: this pgmemo has no --cache flag: pgmemo-on is skipped, pgmemo-off "
                    "runs without the flag")
                if "pgmemo-off" in status:
                    status["pgmemo-off"] = "ran without `--cache` (this pgmemo has no such flag: no cache)"
                if "pgmemo-on" in status:
                    status["pgmemo-on"] = "skipped: unsupported (this pgmemo has no `--cache` flag)"
    if "pgpool" in status:
        setup["pgpool"] = find_pgpool()
        if setup["pgpool"]:
            status["pgpool"] = (f"ran: {passthrough.version([setup['pgpool'], '--version'])}, "
                                "memory_cache_enabled = on, memqcache_method = shmem, raw mode")
        else:
            status["pgpool"] = "skipped: pgpool not installed (`apt-get install -y pgpool2`)"
    if "nullpg" in status:
        setup["nullpg"], why = resolve_nullpg(args)
        status["nullpg"] = f"ran: {setup['nullpg']}" if setup["nullpg"] else f"skipped: {why}"
    for t, s in status.items():
        if s.startswith("skipped"):
            log(f"{t}: {s}")
    runnable = [t for t in ALL_TARGETS if t in status and not status[t].startswith("skipped")]
    return setup, status, runnable


def set_synchronous_commit(tools, value):
    """Sets synchronous_commit for new sessions of the benchmark database (servers are started
    afterwards, so every target's server connections get it)."""
    current = passthrough.psql(tools, "SELECT coalesce((SELECT s FROM pg_db_role_setting r, "
                               "pg_database d, unnest(r.setconfig) s WHERE d.datname = "
                               f"'{DB}' AND r.setdatabase = d.oid AND r.setrole = 0 AND "
                               "s LIKE 'synchronous_commit=%'), 'synchronous_commit=on')")
    if current != f"synchronous_commit={value}":
        log(f"ALTER DATABASE {DB} SET synchronous_commit = {value}")
        passthrough.psql(tools, f"ALTER DATABASE {DB} SET synchronous_commit = {value}")


def write_scripts(workdir):
    """Writes the pgbench scripts; returns name -> path."""
    d = workdir / "scripts"
    d.mkdir()
    paths = {}
    for name, text in SCRIPTS.items():
        paths[name] = d / f"{name}.sql"
        paths[name].write_text(text)
    return paths


def start_round(targets, setup, args, workdir):
    """Starts every target afresh. Returns (servers, start errors by target)."""
    servers, errors = {}, {}
    for t in targets:
        try:
            servers[t] = start_server(t, setup, args, workdir)
        except (BenchError, OSError) as e:
            log(f"warning: {t} did not start: {e}")
            errors[t] = f"did not start: {str(e).splitlines()[0]}"
    return servers, errors


def record(meta, results, rnd, key, target, res, progress):
    """Stores one run's result and logs it."""
    results.setdefault(key, {}).setdefault(target, []).append((rnd, res))
    meta["runs"].append({"round": rnd, "workload": key, "target": target, "res": res})
    head = f"{progress} round {rnd + 1} {key} {target}"
    if not res["ok"]:
        log(f"{head}: FAILED\n{res.get('error', '')}")
    elif "first_ms" in res:
        log(f"{head}: first {res['first_ms']:.3f} ms, repeated {res['repeat_ms']:.3f} ms")
    else:
        extra = f", {res['cpu_us_txn']:.1f} µs CPU/txn" if res["cpu_us_txn"] is not None else ""
        extra += f", {res['hit_ratio'] * 100:.1f}% hits" if res["hit_ratio"] is not None else ""
        log(f"{head}: {res['tps']:,.0f} tps, {res['lat_ms']:.3f} ms mean, "
            f"{res['p99_ms']:.3f} ms p99{extra}")


def vacuum(tools):
    """VACUUM ANALYZE pgbench_accounts: clears the dead rows the read/write mix left, so that
    they (or an autovacuum run) do not slow down the next round's first queries."""
    passthrough.psql(tools, "VACUUM ANALYZE pgbench_accounts", db=DB)


def run_round(rnd, targets, setup, args, scripts, workdir, meta, results, counter):
    """One round: vacuum, fresh servers, the latency step, then every workload on every target."""
    vacuum(setup["tools"])
    rdir = workdir / f"round{rnd + 1}"
    rdir.mkdir()
    servers, errors = start_round(targets, setup, args, rdir)
    order = targets[rnd % len(targets):] + targets[:rnd % len(targets)]
    logdir = workdir / "pgbench-log"
    try:
        if "latency" in args.workloads:
            for t in order:
                counter[0] += 1
                if t in errors:
                    res = {"ok": False, "error": errors[t]}
                else:
                    passthrough.wait_for_slots(setup["tools"], 2)
                    res = run_latency(setup["tools"], servers[t], args.repeats)
                record(meta, results, rnd, "latency", t, res, f"[{counter[0]}/{counter[1]}]")
        for wl in meta["workloads"]:
            for t in order:
                if t == "nullpg" and not wl.nullpg:
                    continue
                counter[0] += 1
                if t in errors:
                    res = {"ok": False, "error": errors[t]}
                else:
                    passthrough.wait_for_slots(setup["tools"], wl.clients + 1)
                    res = run_pgbench(setup["tools"], servers[t], wl, scripts, args.scale, logdir,
                                      duration=args.duration)
                record(meta, results, rnd, wl.key, t, res, f"[{counter[0]}/{counter[1]}]")
    finally:
        for s in servers.values():
            s.stop()


def count_runs(args, targets, wls):
    """Number of pgbench runs per round."""
    n = len(targets) if "latency" in args.workloads else 0
    for wl in wls:
        n += sum(1 for t in targets if t != "nullpg" or wl.nullpg)
    return n


def main():
    args = parse_args()
    tools = {n: passthrough.find_tool(n) for n in ("pgbench", "psql")}
    for n, path in tools.items():
        if not path:
            raise BenchError(f"{n} not found (PATH, /usr/lib/postgresql/*/bin)")
    setup, status, targets = resolve_targets(args, tools)
    if not targets:
        raise BenchError("no targets left to run")
    passthrough.prepare_db(tools, args.scale)
    set_synchronous_commit(tools, args.synchronous_commit)
    free = passthrough.free_slots(tools)
    if free < args.clients + 1:
        raise BenchError(f"the server has {free} free connections, {args.clients} clients need "
                         f"{args.clients + 1}: use fewer --clients or raise max_connections")

    wls = [wl for wl in workloads(args.clients) if wl.key in args.workloads]
    per_round = count_runs(args, targets, wls)
    eta = args.rounds * (per_round * (args.duration + 2) + 15)
    log(f"{args.rounds} round(s) of {per_round} runs: about {eta / 60:.0f} min" if eta >= 120
        else f"{args.rounds} round(s) of {per_round} runs: about {eta:.0f} s")

    workdir = Path(tempfile.mkdtemp(prefix="pgmemo-cache-bench-"))
    try:
        scripts = write_scripts(workdir)
        log("warm-up: the aggregation once and 2 s of lookups over all rows, direct")
        warm = Server("direct", PG_PORT)
        run_pgbench(tools, warm, Workload("warm", "", (("agg", 1),), 1, "simple", True), scripts,
                    args.scale, workdir / "pgbench-log", transactions=1)
        run_pgbench(tools, warm, Workload("warm", "", (("all", 1),), min(args.clients, 8), "simple", True),
                    scripts, args.scale, workdir / "pgbench-log", duration=2)
        meta = {
            "when": datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"),
            "runs": [], "workloads": wls, "targets": status,
            "info": {
                "command": "python3 bench/cache.py " + " ".join(sys.argv[1:]),
                "pgmemo": (f"{setup['pgmemo']}: {passthrough.version([str(setup['pgmemo']), '--version'])}, "
                           f"git {passthrough.git_rev()}") if setup.get("pgmemo") else "not run",
                "postgres": passthrough.psql(tools, "SHOW server_version") + f" on {PG_HOST}:{PG_PORT}",
                "pgbench": passthrough.version([tools["pgbench"], "--version"]),
                "machine": f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start",
                "settings": f"scale {args.scale}, synchronous_commit {args.synchronous_commit}, "
                            f"{args.clients} clients (`-j` min(clients, 2)), "
                            f"{args.duration}s per run, {args.rounds} round(s); pgmemo: {args.pool_mode} "
                            f"pooling, pool size {args.pool_size or args.clients}, "
                            f"--worker-threads {args.pgmemo_workers}; "
                            f"every server restarted at the start of each round",
            },
        }
        results = {}
        counter = [0, per_round * args.rounds]
        for rnd in range(args.rounds):
            run_round(rnd, targets, setup, args, scripts, workdir, meta, results, counter)
        report = build_report(meta, targets, args.workloads, results, args.repeats)
        passthrough.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        out = passthrough.RESULTS_DIR / f"cache-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}.md"
        out.write_text(report)
        print(report)
        log(f"written to {out.relative_to(ROOT)}")
        for b, m, n, v in bars(results):
            log(f"bar: {v:4} {b}: {m} (needed {n})")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    signal.signal(signal.SIGTERM, passthrough.on_signal)
    signal.signal(signal.SIGHUP, passthrough.on_signal)
    try:
        main()
    except BenchError as e:
        log(f"error: {e}")
        sys.exit(1)
    except KeyboardInterrupt:
        log("interrupted")
        sys.exit(130)
