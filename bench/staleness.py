#!/usr/bin/env python3
"""Staleness benchmark (issue 5): how long pgmemo keeps serving a result after a write made
directly to PostgreSQL (not through pgmemo) committed, with the replication feed on, while 8
clients read through pgmemo and a writer updates other rows directly at 100, 1,000 and 5,000
writes per second; and what the feed costs the readers (read throughput with the feed on and
off at the same write rate).

Set-up, all in one run: a throwaway cluster (initdb in a temp dir, wal_level=logical, free port,
run as `postgres`), pgmemo from ../target-bench (built unless --no-build) with
`--invalidation replication` (feed on) or `proxy` (feed off), pgbench for the readers (through
pgmemo, `-M prepared`, a hot set of 1,000 rows) and for the writer (directly, `-R rate`).

Readers read table kv, the writer updates table w, the probe its own table (invalidation is per
table: writes to the table being read would change the readers' hit ratio, not measure the feed).
The staleness probe: a row the load does not touch is read through pgmemo until it is cached,
then updated directly; the probe reads it through pgmemo in a tight loop until the new value
shows. One sample is the time from the UPDATE's acknowledgement to the first fresh read (an
upper bound: it includes one read round trip). Samples are taken every 20 ms during the load.
All processes share this 2-core machine, so the load generators compete with pgmemo and
PostgreSQL for CPU: read the numbers as this machine's, not as pgmemo's alone.

    python3 bench/staleness.py                    # rates 100,1000,5000, 10 s each: about 2 minutes
    python3 bench/staleness.py --rates 1000 --duration 5 --no-build

Python 3 standard library only (plus pgbench, psql, initdb, pg_ctl from PostgreSQL 15).
"""

import argparse
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as passthrough  # noqa: E402  (bench/run.py: pgmemo start-up, free ports, logging)
from run import BenchError, log  # noqa: E402

ROOT = passthrough.ROOT
PGBIN = Path("/usr/lib/postgresql/15/bin")
DB = "bench"
HOT_ROWS = 1000
PROBE_KEY = 0
READERS = 8


# ---------------------------------------------------------------------------------------------
# A throwaway cluster

class Cluster:
    """initdb + pg_ctl in a temp dir, as `postgres` when we are root."""

    def __init__(self, workdir):
        self.dir = workdir / "pgdata"
        self.port = passthrough.free_port()
        self.as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_pg:
            shutil.chown(workdir, "postgres")
        self.run([PGBIN / "initdb", "-D", self.dir, "-A", "trust", "-U", "postgres", "--no-sync"])
        conf = (f"port = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{workdir}'\n"
                "wal_level = logical\nmax_wal_senders = 10\nmax_replication_slots = 10\n"
                "max_connections = 100\nfsync = off\n")
        with open(self.dir / "postgresql.conf", "a") as f:
            f.write(conf)
        self.run([PGBIN / "pg_ctl", "-D", self.dir, "-l", workdir / "pg.log", "-w", "start"])

    def run(self, cmd):
        subprocess.run(self.as_pg + [str(c) for c in cmd], check=True, stdout=subprocess.DEVNULL)

    def stop(self):
        subprocess.run(self.as_pg + [str(PGBIN / "pg_ctl"), "-D", str(self.dir), "-m", "immediate", "stop"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def psql(port, sql, db=DB):
    out = subprocess.run([str(PGBIN / "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
                          "-d", db, "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise BenchError(f"psql on {port}: {out.stderr.strip()}")
    return out.stdout.strip()


# ---------------------------------------------------------------------------------------------
# A minimal simple-query client for the probe (trust auth, text results)

class MiniPg:
    def __init__(self, port, db=DB):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        body = struct.pack("!I", 196608) + b"user\0postgres\0database\0" + db.encode() + b"\0\0"
        self.sock.sendall(struct.pack("!I", len(body) + 4) + body)
        self.buf = b""
        while self._message()[0] != b"Z":
            pass

    def _message(self):
        while len(self.buf) < 5 or len(self.buf) < 1 + struct.unpack("!I", self.buf[1:5])[0]:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise BenchError("connection closed")
            self.buf += chunk
        n = 1 + struct.unpack("!I", self.buf[1:5])[0]
        tag, body, self.buf = self.buf[:1], self.buf[5:n], self.buf[n:]
        if tag == b"E":
            raise BenchError(f"server error: {body!r}")
        return tag, body

    def value(self, sql):
        """The first column of the first row (text), or None."""
        q = sql.encode() + b"\0"
        self.sock.sendall(b"Q" + struct.pack("!I", len(q) + 4) + q)
        value = None
        while True:
            tag, body = self._message()
            if tag == b"D" and value is None:
                n = struct.unpack("!i", body[2:6])[0]
                value = body[6:6 + n].decode() if n >= 0 else None
            elif tag == b"Z":
                return value


# ---------------------------------------------------------------------------------------------
# Load and probe

def pgbench(port, script, clients, duration, extra=()):
    return subprocess.Popen([str(PGBIN / "pgbench"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
                             "-n", "-c", str(clients), "-j", str(min(clients, 2)), "-T", str(duration),
                             "-f", str(script), *extra, DB],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def tps_of(popen):
    out, _ = popen.communicate()
    for line in out.splitlines():
        if line.startswith("tps = "):
            return float(line.split()[2])
    raise BenchError(f"pgbench failed:\n{out[-2000:]}")


def probe(memo_port, pg_port, until, samples, errors):
    """Staleness samples (seconds) of the probe row until `until`."""
    try:
        memo, direct = MiniPg(memo_port), MiniPg(pg_port)
        read = f"SELECT v FROM probe WHERE k = {PROBE_KEY}"
        n = int(memo.value(read) or 0)
        while time.monotonic() < until:
            memo.value(read)  # cached before the write
            n += 1
            direct.value(f"UPDATE probe SET v = {n} WHERE k = {PROBE_KEY}")
            acked = time.monotonic()
            while int(memo.value(read)) < n:
                if time.monotonic() - acked > 10:
                    raise BenchError(f"write {n} not seen through pgmemo after 10 s")
            samples.append(time.monotonic() - acked)
            time.sleep(0.02)
    except Exception as e:  # reported by the caller
        errors.append(e)


def wait_feed_live(memo_port):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            state = psql(memo_port, "SHOW REPLICATION", db="pgmemo")
            if "|live|" in state:
                return
        except BenchError:
            pass
        time.sleep(0.2)
    raise BenchError("the replication feed did not become live within 30 s")


def measure(binary, cluster, workdir, invalidation, rate, duration, scripts):
    """One run: readers through pgmemo, the writer directly; (reads/s, staleness samples)."""
    memo = passthrough.start_pgmemo(binary, READERS + 4, "session", workdir, 1,
                                    extra_args=["--invalidation", invalidation, "--cache", "on"],
                                    name=f"pgmemo-{invalidation}-{rate}",
                                    upstream=f"postgres://postgres@127.0.0.1:{cluster.port}/{DB}")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                psql(memo.port, "SELECT 1")
                break
            except BenchError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        if invalidation == "replication":
            wait_feed_live(memo.port)
        writer = pgbench(cluster.port, scripts["write"], 2, duration, ["-R", str(rate)])
        readers = pgbench(memo.port, scripts["read"], READERS, duration, ["-M", "prepared"])
        samples, errors = [], []
        prober = None
        if invalidation == "replication":
            prober = threading.Thread(target=probe, args=(memo.port, cluster.port,
                                                          time.monotonic() + duration - 0.5, samples, errors))
            prober.start()
        reads = tps_of(readers)
        tps_of(writer)
        if prober:
            prober.join()
        if errors:
            raise BenchError(f"probe: {errors[0]}")
        return reads, samples
    finally:
        memo.stop()


def pct(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rates", default="100,1000,5000", help="direct writes per second, comma-separated")
    p.add_argument("--duration", type=int, default=10, help="seconds per run")
    p.add_argument("--no-build", action="store_true", help="use ../target-bench's pgmemo as it is")
    p.add_argument("--pgmemo-bin", help="this pgmemo binary (no build)")
    args = p.parse_args()
    rates = [int(r) for r in args.rates.split(",")]
    target_dir = ROOT.parent / "target-bench"
    binary = Path(args.pgmemo_bin) if args.pgmemo_bin else target_dir / "release" / "pgmemo"
    if not args.no_build and not args.pgmemo_bin:
        log("building pgmemo (release)")
        subprocess.run(["cargo", "build", "--release", "-p", "pgmemo"], cwd=ROOT, check=True,
                       env={**os.environ, "CARGO_TARGET_DIR": str(target_dir)})
    workdir = Path(tempfile.mkdtemp(prefix="pgmemo-staleness-"))
    os.chmod(workdir, 0o755)
    cluster = None
    try:
        cluster = Cluster(workdir)
        psql(cluster.port, f"CREATE DATABASE {DB}", db="postgres")
        # Readers read kv, the writer writes w, the probe its own row of probe: invalidation is
        # per table, so writes to the table being read would turn the readers' hits into misses
        # with the feed on (and leave them stale with it off), and the comparison would measure
        # that instead of the feed.
        psql(cluster.port, "CREATE TABLE kv (k int PRIMARY KEY, v bigint NOT NULL); "
                           f"INSERT INTO kv SELECT g, 0 FROM generate_series(1, {HOT_ROWS}) g; "
                           "CREATE TABLE w (k int PRIMARY KEY, v bigint NOT NULL); "
                           f"INSERT INTO w SELECT g, 0 FROM generate_series(1, {HOT_ROWS}) g; "
                           "CREATE TABLE probe (k int PRIMARY KEY, v bigint NOT NULL); "
                           f"INSERT INTO probe VALUES ({PROBE_KEY}, 0)")
        scripts = {"read": workdir / "read.sql", "write": workdir / "write.sql"}
        scripts["read"].write_text(f"\\set k random(1, {HOT_ROWS})\nSELECT v FROM kv WHERE k = :k;\n")
        scripts["write"].write_text(f"\\set k random(1, {HOT_ROWS})\nUPDATE w SET v = v + 1 WHERE k = :k;\n")
        rows = []
        for rate in rates:
            log(f"{rate} writes/s: feed on")
            on, samples = measure(binary, cluster, workdir, "replication", rate, args.duration, scripts)
            log(f"{rate} writes/s: feed off")
            off, _ = measure(binary, cluster, workdir, "proxy", rate, args.duration, scripts)
            rows.append((rate, samples, on, off))
        print("\n| writes/s | samples | staleness p50 ms | p99 ms | max ms | reads/s feed on | reads/s feed off | on / off |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for rate, samples, on, off in rows:
            ms = [s * 1000 for s in samples]
            print(f"| {rate:,} | {len(ms)} | {pct(ms, 0.5):.2f} | {pct(ms, 0.99):.2f} | {max(ms, default=float('nan')):.2f} "
                  f"| {on:,.0f} | {off:,.0f} | {on / off:.3f} |")
        for rate, samples, on, off in rows:
            if rate == 1000:
                p99 = pct([s * 1000 for s in samples], 0.99)
                print(f"\nbar: p99 staleness at 1,000 writes/s under 50 ms: {p99:.2f} ms: "
                      f"{'met' if p99 < 50 else 'NOT met'}; reads with the feed on within 10% of off: "
                      f"{on / off:.3f}: {'met' if on / off >= 0.9 else 'NOT met'}")
    finally:
        if cluster:
            cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        sys.exit(f"staleness benchmark failed: {e}")
