#!/usr/bin/env python3
"""Pass-through benchmark: pgbench -S straight to PostgreSQL, through pgmemo and through PgBouncer.

Runs are interleaved (every target back to back for each clients/mode cell, the order rotated
per round), and each proxy's CPU time during a run is read from /proc/PID/stat. The report (medians
over rounds) is printed as Markdown and written to bench/results/passthrough-<timestamp>.md.
See bench/README.md. Python 3 standard library only.
"""

import argparse
import datetime
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"

PG_HOST = "127.0.0.1"
PG_PORT = 5432
PG_USER = "postgres"
DB = "pgmemo_bench"
ALL_TARGETS = ("direct", "pgmemo", "pgbouncer")
ALL_MODES = ("simple", "extended", "prepared")

# Both proxies close server connections idle for this long, so that the idle pool one proxy kept
# after its run does not use up max_connections for the next target (3 targets x 32 clients is
# close to the default limit of 100). pgbench's tps excludes connection set-up, so this does not
# change what is measured.
SERVER_IDLE_TIMEOUT_S = 2
SLOT_WAIT_S = 30  # longest wait for free server connection slots before a run

CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Tools and the local server

def find_tool(name):
    path = shutil.which(name)
    if path:
        return path
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (d / name).exists():
            return str(d / name)
    return None


def pg_env():
    env = dict(os.environ)
    for k in ("PGOPTIONS", "PGSERVICE", "PGSSLMODE", "PGDATABASE", "PGHOST", "PGPORT", "PGUSER"):
        env.pop(k, None)
    env["PGCONNECT_TIMEOUT"] = "10"
    return env


def psql(tools, sql, db="postgres", port=PG_PORT):
    r = subprocess.run(
        [tools["psql"], "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1",
         "-h", PG_HOST, "-p", str(port), "-U", PG_USER, "-d", db, "-c", sql],
        capture_output=True, text=True, env=pg_env(), timeout=60)
    if r.returncode != 0:
        raise BenchError(f"psql -d {db} -p {port} -c {sql!r} failed: {r.stderr.strip()}")
    return r.stdout.strip()


def prepare_db(tools, scale):
    if psql(tools, f"SELECT 1 FROM pg_database WHERE datname = '{DB}'") != "1":
        log(f"creating database {DB}")
        psql(tools, f"CREATE DATABASE {DB}")
    tables = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history")
    present = psql(tools, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename IN ("
                   + ", ".join(f"'{t}'" for t in tables) + ")", db=DB)
    have = None
    if present == str(len(tables)):
        have = int(psql(tools, "SELECT count(*) FROM pgbench_branches", db=DB))
    if have == scale:
        log(f"{DB}: pgbench tables present at scale {scale}")
        return
    why = "missing" if have is None else f"at scale {have}"
    log(f"{DB}: pgbench tables {why}; running pgbench -i -s {scale}")
    r = subprocess.run([tools["pgbench"], "-i", "-s", str(scale), "-q", "-h", PG_HOST,
                        "-p", str(PG_PORT), "-U", PG_USER, DB],
                       capture_output=True, text=True, env=pg_env())
    if r.returncode != 0:
        raise BenchError(f"pgbench -i failed:\n{r.stderr.strip()}")


def free_slots(tools):
    """Connections still available on the server (max_connections minus client backends)."""
    n = psql(tools, "SELECT current_setting('max_connections')::int - count(*) "
                    "FROM pg_stat_activity WHERE backend_type = 'client backend'")
    return int(n) + 1  # this psql's own connection is gone once it exits


def wait_for_slots(tools, need):
    deadline = time.monotonic() + SLOT_WAIT_S
    while True:
        free = free_slots(tools)
        if free >= need:
            return
        if time.monotonic() > deadline:
            log(f"warning: only {free} free connections on the server, {need} wanted; running anyway")
            return
        time.sleep(0.25)


# ---------------------------------------------------------------------------------------------
# Processes

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path, n=20):
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:]) or "(empty log)"


class Proxy:
    """A proxy process we started; `pid` is the process whose CPU time is measured."""

    def __init__(self, name, popen, port, logfile):
        self.name, self.popen, self.port, self.logfile = name, popen, port, logfile
        self.pid = popen.pid

    def check_alive(self):
        if self.popen.poll() is not None:
            raise BenchError(f"{self.name} exited with status {self.popen.returncode}; "
                             f"log {self.logfile}:\n{tail(self.logfile)}")

    def wait_ready(self, tools, timeout=30.0):
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise BenchError(f"{self.name} did not listen on port {self.port} "
                                     f"within {timeout:.0f}s; log:\n{tail(self.logfile)}")
                time.sleep(0.05)
        # The port accepts; check that a query goes through to the server.
        try:
            psql(tools, "SELECT 1", db=DB, port=self.port)
        except BenchError as e:
            raise BenchError(f"{e}\n{self.name} log:\n{tail(self.logfile)}") from None

    def stop(self):
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def pgmemo_binary():
    target_dir = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    if not target_dir.is_absolute():
        target_dir = ROOT / target_dir
    return target_dir / "release" / "pgmemo"


def pgmemo_has_cache_flag(binary):
    """True when this pgmemo build has the `--cache on|off` switch (read from `pgmemo --help`)."""
    try:
        r = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return re.search(r"--cache(?![-\w])", r.stdout + r.stderr) is not None


def start_pgmemo(binary, pool_size, pool_mode, workdir, workers, extra_args=(), name="pgmemo",
                 upstream=None):
    """Starts pgmemo on a free port; `extra_args` are appended to its command line (bench/cache.py
    passes `--cache on|off`), `name` names the proxy and its log file in `workdir`, `upstream`
    replaces the default `--upstream postgres://PG_HOST:PG_PORT`."""
    port = free_port()
    logfile = workdir / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGMEMO_")}
    env["PGMEMO_LOG"] = "warn"
    env["PGMEMO_SERVER_IDLE_TIMEOUT"] = f"{SERVER_IDLE_TIMEOUT_S}s"
    cmd = [str(binary), "--listen", f"127.0.0.1:{port}",
           "--upstream", upstream or f"postgres://{PG_HOST}:{PG_PORT}",
           "--pool-mode", pool_mode, "--pool-size", str(pool_size), "--log-level", "warn",
           "--worker-threads", str(workers), *extra_args]
    with open(logfile, "wb") as out:
        popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=env, cwd=workdir, start_new_session=True)
    return Proxy(name, popen, port, logfile)


def start_pgbouncer(binary, pool_size, pool_mode, workdir, extra_settings=(), upstream_host=None):
    """Starts PgBouncer on a free port from a config in `workdir`/pgbouncer; `extra_settings` are
    more `key = value` lines for its [pgbouncer] section; `upstream_host` replaces PG_HOST (a
    directory: PostgreSQL's Unix-domain socket)."""
    port = free_port()
    extra = "".join(f"{line}\n" for line in extra_settings)
    d = workdir / "pgbouncer"
    d.mkdir()
    logfile = d / "pgbouncer.log"
    (d / "userlist.txt").write_text(f'"{PG_USER}" ""\n')
    (d / "pgbouncer.ini").write_text(f"""\
[databases]
{DB} = host={upstream_host or PG_HOST} port={PG_PORT} dbname={DB}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {d}/userlist.txt
admin_users = {PG_USER}
pool_mode = {pool_mode}
default_pool_size = {pool_size}
max_client_conn = 1000
server_idle_timeout = {SERVER_IDLE_TIMEOUT_S}
ignore_startup_parameters = extra_float_digits,options
logfile = {logfile}
pidfile = {d}/pgbouncer.pid
log_connections = 0
log_disconnections = 0
{extra}""")
    kwargs = {}
    if os.geteuid() == 0:
        # PgBouncer refuses to run as root. Popen switches user itself (as `runuser -u postgres`
        # would), so popen.pid is PgBouncer's own PID, the one whose CPU time we read.
        import pwd
        pw = pwd.getpwnam("postgres")
        os.chmod(workdir, 0o711)  # mkdtemp made it 0700
        for p in [d, *d.iterdir()]:
            os.chown(p, pw.pw_uid, pw.pw_gid)
        kwargs = dict(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
    stderr_path = d / "stderr.log"
    with open(stderr_path, "wb") as out:
        popen = subprocess.Popen([binary, str(d / "pgbouncer.ini")], stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 cwd=d, start_new_session=True, **kwargs)
    # PgBouncer logs to stderr as well as to its logfile, and startup errors only to stderr.
    return Proxy("pgbouncer", popen, port, stderr_path)


def cpu_ticks(pid):
    """utime + stime of the whole process (all threads), in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5)


def server_ticks():
    """utime + stime of every PostgreSQL process now, by PID, in clock ticks. Backends come
    and go; one that starts during a run counts from zero, one that ends is lost (a pool's
    backends live through a run, a direct run's end with it: see `cpu_split`)."""
    ticks = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat.rsplit(")", 1)[1].split()
        if comm == "postgres":
            ticks[int(pid)] = int(rest[11]) + int(rest[12])
    return ticks


def children_cpu_s():
    """CPU seconds (user + system) of this script's finished child processes: pgbench's, once
    it has exited."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def machine_ticks():
    """(busy, idle) clock ticks of all CPUs since boot, from /proc/stat (iowait counts idle)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields[:8]) - idle, idle


def cpu_split(before, after, txns):
    """Where the machine's CPU went per transaction (µs) between two `(server_ticks(),
    machine_ticks())` readings: PostgreSQL's processes, all CPUs busy, all CPUs idle. On a
    shared machine these move from run to run far more than a proxy's own CPU does, and
    explain most of the spread in tps. None for a direct run: its backends exit before the
    second reading."""
    (servers0, (busy0, idle0)), (servers1, (busy1, idle1)) = before, after
    us = 1e6 / CLK_TCK / txns
    server = sum(t - servers0.get(pid, 0) for pid, t in servers1.items())
    return server * us, (busy1 - busy0) * us, (idle1 - idle0) * us


# ---------------------------------------------------------------------------------------------
# pgbench

def pgbench_problems(out):
    """Errors in pgbench's output: (server errors (ERROR/FATAL/PANIC lines), aborted clients,
    the first 3 distinct error lines, lines differing only in numbers counted as one)."""
    errors, aborted, samples = 0, 0, {}
    for line in out.splitlines():
        if re.search(r"\bclient \d+ (script \d+ )?aborted", line):
            aborted += 1
        if re.search(r"\b(ERROR|FATAL|PANIC):", line):
            errors += 1
            key = re.sub(r"\d+", "N", line.strip())[:300]
            if len(samples) < 3:
                samples.setdefault(key, line.strip()[:300])
    return errors, aborted, list(samples.values())


def run_pgbench(tools, port, clients, mode, duration, proxy):
    cmd = [tools["pgbench"], "-S", "-n", "-T", str(duration), "-c", str(clients),
           "-j", str(min(clients, 2)), "-M", mode,
           "-h", "127.0.0.1", "-p", str(port), "-U", PG_USER, DB]
    if proxy:
        proxy.check_alive()
    before = cpu_ticks(proxy.pid) if proxy else None
    split_before = (server_ticks(), machine_ticks())
    client_before = children_cpu_s()
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, env=pg_env(), timeout=duration + 120)
    wall = time.monotonic() - t0
    after = cpu_ticks(proxy.pid) if proxy else None
    split_after = (server_ticks(), machine_ticks())
    client_s = children_cpu_s() - client_before
    out = r.stdout + r.stderr

    def grab(pattern):
        m = re.search(pattern, out)
        return float(m.group(1)) if m else None

    res = {
        "ok": r.returncode == 0,
        "txns": grab(r"number of transactions actually processed: (\d+)"),
        "failed": grab(r"number of failed transactions: (\d+)"),
        "tps": grab(r"tps = ([\d.]+) \(without initial connection time\)") or grab(r"tps = ([\d.]+)"),
        "lat_ms": grab(r"latency average = ([\d.]+) ms"),
        "wall_s": wall,
        "cpu_s": None,
        "cpu_us_txn": None,
        "server_us_txn": None,
        "client_us_txn": None,
        "busy_us_txn": None,
        "idle_us_txn": None,
    }
    res["errors"], res["aborted"], res["error_samples"] = pgbench_problems(out)
    if res["ok"] and (res["tps"] is None or not res["txns"]):
        res["ok"] = False
    if not res["ok"]:
        lines = out.strip().splitlines() or ["(no output)"]
        res["error"] = "\n".join(dict.fromkeys([lines[0][:300], lines[-1][:300]]))
    if proxy and res["ok"]:
        res["cpu_s"] = (after - before) / CLK_TCK
        res["cpu_us_txn"] = res["cpu_s"] * 1e6 / res["txns"]
        res["server_us_txn"], res["busy_us_txn"], res["idle_us_txn"] = cpu_split(
            split_before, split_after, res["txns"])
        res["client_us_txn"] = client_s * 1e6 / res["txns"]
    return res


# ---------------------------------------------------------------------------------------------
# Report

def fmt(v, spec):
    return "—" if v is None else format(v, spec)


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def build_report(args, meta, targets, results):
    """results[(clients, mode)][target] = list of (round, result)."""
    lines = [f"# pgmemo pass-through benchmark, {meta['when']}", ""]
    lines += [f"- {k}: {v}" for k, v in meta["info"].items()]
    lines += ["",
              "Medians over rounds. `× direct`: the median over rounds of tps / direct tps in the "
              "same round. `CPU µs/txn`: the proxy process's CPU time (user + system) during the "
              "run divided by the transactions pgbench processed. `spread`: (max − min) / median "
              "of tps over rounds.", ""]
    comparisons = []
    for (clients, mode), per_target in results.items():
        lines += [f"## {clients} client{'s' if clients != 1 else ''}, -M {mode}", "",
                  "| target | tps | latency ms | × direct | CPU µs/txn | spread | runs ok |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        direct_by_round = {rnd: r["tps"] for rnd, r in per_target.get("direct", []) if r["ok"]}
        for t in targets:
            runs = per_target.get(t, [])
            ok = [(rnd, r) for rnd, r in runs if r["ok"]]
            tps = [r["tps"] for _, r in ok]
            ratios = [r["tps"] / direct_by_round[rnd] for rnd, r in ok if rnd in direct_by_round]
            m_tps = med(tps)
            spread = (max(tps) - min(tps)) / m_tps * 100 if len(tps) > 1 and m_tps else None
            lines.append(
                f"| {t} | {fmt(m_tps, ',.0f')} | {fmt(med([r['lat_ms'] for _, r in ok]), '.3f')} "
                f"| {fmt(med(ratios) if t != 'direct' else None, '.3f')} "
                f"| {fmt(med([r['cpu_us_txn'] for _, r in ok]), '.1f')} "
                f"| {fmt(spread, '.1f') + '%' if spread is not None else '—'} | {len(ok)}/{len(runs)} |")
        lines.append("")
        if "pgmemo" in per_target and "pgbouncer" in per_target:
            mem = {rnd: r for rnd, r in per_target["pgmemo"] if r["ok"]}
            bnc = {rnd: r for rnd, r in per_target["pgbouncer"] if r["ok"]}
            both = sorted(set(mem) & set(bnc))
            comparisons.append((clients, mode,
                                med([mem[i]["tps"] / bnc[i]["tps"] for i in both]),
                                med([r["cpu_us_txn"] for r in mem.values()]),
                                med([r["cpu_us_txn"] for r in bnc.values()])))
    if comparisons:
        lines += ["## pgmemo against PgBouncer", "",
                  "The bar: pgmemo's tps at least PgBouncer's at 8 and 32 clients, and less proxy CPU "
                  "per transaction. `tps ratio`: median over rounds of pgmemo tps / PgBouncer tps in "
                  "the same round.", "",
                  "| clients | mode | tps ratio | tps bar | CPU µs/txn pgmemo | CPU µs/txn PgBouncer | CPU bar |",
                  "|---:|---|---:|---|---:|---:|---|"]
        for clients, mode, ratio, cm, cb in comparisons:
            if clients not in (8, 32):
                tps_bar = "(not part of the bar)"
            else:
                tps_bar = "n/a" if ratio is None else ("met" if ratio >= 1.0 else "not met")
            cpu_bar = "n/a" if cm is None or cb is None else ("met" if cm < cb else "not met")
            lines.append(f"| {clients} | {mode} | {fmt(ratio, '.3f')} | {tps_bar} | {fmt(cm, '.1f')} "
                         f"| {fmt(cb, '.1f')} | {cpu_bar} |")
        lines.append("")
    lines += ["## Runs", "",
              "| round | clients | mode | target | tps | latency ms | txns | proxy CPU s | CPU µs/txn | note |",
              "|---:|---:|---|---|---:|---:|---:|---:|---:|---|"]
    for run in meta["runs"]:
        r = run["res"]
        note = "" if r["ok"] else "FAILED: " + r.get("error", "").replace("\n", " / ").replace("|", "\\|")
        if r["ok"] and r.get("failed"):
            note = f"{r['failed']:.0f} failed transactions"
        lines.append(f"| {run['round'] + 1} | {run['clients']} | {run['mode']} | {run['target']} "
                     f"| {fmt(r['tps'], ',.0f')} | {fmt(r['lat_ms'], '.3f')} | {fmt(r['txns'], '.0f')} "
                     f"| {fmt(r['cpu_s'], '.2f')} | {fmt(r['cpu_us_txn'], '.1f')} | {note} |")
    lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------

def parse_args():
    def int_list(s):
        try:
            v = [int(x) for x in s.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a list of integers: {s!r}")
        if not v or min(v) < 1:
            raise argparse.ArgumentTypeError("client counts must be ≥ 1")
        return v

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
    p.add_argument("--duration", type=int, default=10, help="seconds per pgbench run")
    p.add_argument("--clients", type=int_list, default="1,8,32", help="comma-separated client counts")
    p.add_argument("--modes", type=name_list(ALL_MODES), default="simple,prepared",
                   help="pgbench -M query modes")
    p.add_argument("--scale", type=int, default=10, help="pgbench scale of the database")
    p.add_argument("--targets", type=name_list(ALL_TARGETS), default=",".join(ALL_TARGETS),
                   help="what pgbench connects to")
    p.add_argument("--pool-mode", choices=("session", "transaction"), default="session",
                   help="pool mode of both proxies")
    p.add_argument("--no-build", action="store_true", help="use the existing target/release/pgmemo")
    p.add_argument("--pgmemo-workers", type=int, default=1,
                   help="pgmemo --worker-threads (default 1, like PgBouncer's single thread; "
                        "0 = one per core)")
    a = p.parse_args()
    if a.rounds < 1 or a.duration < 1 or a.scale < 1:
        p.error("--rounds, --duration and --scale must be ≥ 1")
    return a


def version(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        return (r.stdout or r.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "?"


def git_rev():
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return rev + (" (with uncommitted changes)" if dirty else "") if rev else "?"
    except OSError:
        return "?"


def main():
    args = parse_args()
    tools = {n: find_tool(n) for n in ("pgbench", "psql")}
    for n, path in tools.items():
        if not path:
            raise BenchError(f"{n} not found (PATH, /usr/lib/postgresql/*/bin)")
    targets = list(args.targets)
    pgbouncer_bin = find_tool("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None)
    if "pgbouncer" in targets and not pgbouncer_bin:
        log("pgbouncer is not installed: skipping it")
        targets.remove("pgbouncer")
    if not targets:
        raise BenchError("no targets left to run")
    max_clients = max(args.clients)

    binary = pgmemo_binary()
    if "pgmemo" in targets:
        if not args.no_build:
            log("cargo build --release -p pgmemo")
            subprocess.run(["cargo", "build", "--release", "-p", "pgmemo"], cwd=ROOT, check=True)
        if not binary.exists():
            raise BenchError(f"{binary} does not exist (drop --no-build?)")

    prepare_db(tools, args.scale)
    free = free_slots(tools)
    if free < max_clients + 1:
        raise BenchError(f"the server has {free} free connections, {max_clients} clients need "
                         f"{max_clients + 1}: use fewer --clients or raise max_connections")

    runs_total = args.rounds * len(args.clients) * len(args.modes) * len(targets)
    eta = runs_total * (args.duration + 1.5)
    log(f"{runs_total} runs of {args.duration}s: about {eta / 60:.0f} min" if eta >= 120
        else f"{runs_total} runs of {args.duration}s: about {eta:.0f} s")

    workdir = Path(tempfile.mkdtemp(prefix="pgmemo-bench-"))
    proxies = {}
    try:
        if "pgmemo" in targets:
            # Pass-through: the result cache (when this build has one) stays off.
            extra = ["--cache", "off"] if pgmemo_has_cache_flag(binary) else []
            proxies["pgmemo"] = start_pgmemo(binary, max_clients, args.pool_mode, workdir,
                                             args.pgmemo_workers, extra_args=extra)
        if "pgbouncer" in targets:
            proxies["pgbouncer"] = start_pgbouncer(pgbouncer_bin, max_clients, args.pool_mode, workdir)
        for p in proxies.values():
            p.wait_ready(tools)
            log(f"{p.name} ready on port {p.port} (pid {p.pid})")
        ports = {"direct": PG_PORT, **{n: p.port for n, p in proxies.items()}}

        # Warm the server's caches so that the first target measured is not penalised.
        log("warm-up: 2s direct")
        run_pgbench(tools, PG_PORT, min(max_clients, 8), "simple", 2, None)

        meta = {
            "when": datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"),
            "runs": [],
            "info": {
                "command": "python3 bench/run.py " + " ".join(sys.argv[1:]),
                "pgmemo": f"{version([str(binary), '--version'])}, git {git_rev()}"
                          + (", --cache off" if pgmemo_has_cache_flag(binary) else "")
                          if "pgmemo" in targets else "not run",
                "pgbouncer": version([pgbouncer_bin, "--version"]) if pgbouncer_bin else "not installed",
                "postgres": psql(tools, "SHOW server_version") + f" on {PG_HOST}:{PG_PORT}",
                "pgbench": version([tools["pgbench"], "--version"]),
                "machine": f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start",
                "settings": f"scale {args.scale}, pool mode {args.pool_mode}, pool size {max_clients}, "
                            f"{args.duration}s per run, {args.rounds} round(s), "
                            f"server_idle_timeout {SERVER_IDLE_TIMEOUT_S}s in the proxies",
            },
        }
        results = {(c, m): {} for c in args.clients for m in args.modes}
        n = 0
        for rnd in range(args.rounds):
            order = targets[rnd % len(targets):] + targets[:rnd % len(targets)]
            for clients in args.clients:
                for mode in args.modes:
                    for t in order:
                        n += 1
                        wait_for_slots(tools, clients + 1)
                        res = run_pgbench(tools, ports[t], clients, mode, args.duration, proxies.get(t))
                        results[(clients, mode)].setdefault(t, []).append((rnd, res))
                        meta["runs"].append({"round": rnd, "clients": clients, "mode": mode,
                                             "target": t, "res": res})
                        if res["ok"]:
                            cpu = f", {res['cpu_us_txn']:.1f} µs CPU/txn" if res["cpu_us_txn"] else ""
                            log(f"[{n}/{runs_total}] round {rnd + 1} c={clients} {mode} {t}: "
                                f"{res['tps']:,.0f} tps, {res['lat_ms']:.3f} ms{cpu}")
                        else:
                            log(f"[{n}/{runs_total}] round {rnd + 1} c={clients} {mode} {t}: FAILED\n"
                                f"{res.get('error', '')}")
        # results keyed by cell in a stable order
        report = build_report(args, meta, [t for t in ALL_TARGETS if t in targets], results)
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        out = RESULTS_DIR / f"passthrough-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}.md"
        out.write_text(report)
        print(report)
        log(f"written to {out.relative_to(ROOT)}")
    finally:
        for p in proxies.values():
            p.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def on_signal(signum, _frame):
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        main()
    except BenchError as e:
        log(f"error: {e}")
        sys.exit(1)
    except KeyboardInterrupt:
        log("interrupted")
        sys.exit(130)
