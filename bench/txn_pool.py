#!/usr/bin/env python3
"""Transaction-pooling benchmark: pgbench -S through pgmemo and PgBouncer in transaction mode
(a pool of 8 server connections), against direct PostgreSQL, in -M simple, extended and prepared.

8, 32 and 128 clients (`-j 2`) share the pool; runs are interleaved (every target back to back
for each (clients, mode) cell, the order rotated per round). The report gives tps per (mode,
clients) for direct / pgmemo / PgBouncer, the ratios pgmemo / PgBouncer and pgmemo / direct, and
pgmemo's prepared against extended; it is printed as Markdown, written to
bench/results/txn-pool-<timestamp>.md and, with --json PATH, as JSON. A target that cannot start
(pgmemo before transaction pooling exists) or a run that fails is reported, never fatal.
See bench/README.md. Python 3 standard library only; helpers come from bench/run.py.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.dont_write_bytecode = True  # no bench/__pycache__ from importing run.py and cache.py
sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as passthrough  # noqa: E402  (bench/run.py: tools, database, proxies, pgbench, CPU)
from run import BenchError, fmt, log, med  # noqa: E402
from cache import DEFAULT_TARGET_DIR, resolve_pgmemo  # noqa: E402  (build into ../target-bench)

ROOT = passthrough.ROOT
PG_HOST, PG_PORT, PG_USER, DB = passthrough.PG_HOST, passthrough.PG_PORT, passthrough.PG_USER, passthrough.DB

ALL_TARGETS = ("direct", "pgmemo", "pgbouncer")  # report order
ALL_MODES = ("simple", "extended", "prepared")
DEFAULT_CLIENTS = "8,32,128"
PGBENCH_JOBS = 2
MAX_PREPARED_STATEMENTS = 500
# PgBouncer keeps prepared statements in transaction mode from 1.21 on (max_prepared_statements).
PGBOUNCER_PREPARED_SINCE = (1, 21)
# Bars from the issue.
VS_PGBOUNCER_BAR = 1.0   # pgmemo tps / PgBouncer tps, every (mode, clients)
PREPARED_BAR = 1.0       # pgmemo prepared tps / extended tps, every client count (strictly above)


# ---------------------------------------------------------------------------------------------
# Targets

def version_tuple(text):
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    return tuple(int(x or 0) for x in m.groups()) if m else None


def help_text(binary):
    try:
        r = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=10)
        return r.stdout + r.stderr
    except (OSError, subprocess.SubprocessError):
        return ""


def find_pgbouncer():
    return passthrough.find_tool("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None)


def resolve_targets(args, tools):
    """Returns (setup, targets): what each target needs and, per target, its description and
    whether it can run ("status" starts with "skipped" when not)."""
    setup = {"tools": tools}
    targets = {}
    for t in args.targets:
        targets[t] = {"status": "to run", "note": ""}
    if "direct" in targets:
        maxconn = int(passthrough.psql(tools, "SHOW max_connections"))
        setup["max_connections"] = maxconn
        # pgbench's connections plus this script's psql; the superuser may use the reserved slots.
        setup["direct_limit"] = maxconn - 1
        over = [c for c in args.clients if c > setup["direct_limit"]]
        targets["direct"]["note"] = (f"no pool: one server connection per client; max_connections = "
                                     f"{maxconn}")
        if over:
            targets["direct"]["note"] += (f", so {', '.join(map(str, over))} clients "
                                          f"{'are' if len(over) > 1 else 'is'} skipped")
    if "pgmemo" in targets:
        binary = resolve_pgmemo(args)
        if not binary:
            if args.pgmemo_bin:
                why = f"{args.pgmemo_bin} is not executable"
            elif args.no_build:
                why = f"no {args.target_dir / 'release' / 'pgmemo'} (drop --no-build or give --pgmemo-bin)"
            else:
                why = (f"the build failed (see above) and there is no "
                       f"{args.target_dir / 'release' / 'pgmemo'} from an earlier one")
            targets["pgmemo"]["status"] = f"skipped: {why}"
        else:
            setup["pgmemo"] = binary
            h = help_text(binary)
            extra = []
            if re.search(r"--cache(?![-\w])", h):
                extra += ["--cache", "off"]
            if "--max-prepared-statements" in h:
                extra += ["--max-prepared-statements", str(MAX_PREPARED_STATEMENTS)]
            if args.pgmemo_promote:
                if "--max-promoted-statements" not in h:
                    raise SystemExit(f"--pgmemo-promote: {binary} has no --max-promoted-statements")
                extra += ["--max-promoted-statements", str(args.pgmemo_promote)]
            setup["pgmemo_args"] = extra
            rev = "given with --pgmemo-bin" if args.pgmemo_bin else f"git {passthrough.git_rev()}"
            targets["pgmemo"]["note"] = (
                f"{passthrough.version([str(binary), '--version'])} ({binary}), "
                f"{rev}; --pool-mode transaction --pool-size {args.pool_size} "
                f"--worker-threads {args.pgmemo_workers} {' '.join(extra)}".rstrip()
                + f"; --upstream {upstream_url(args)}"
                + ("" if "--max-prepared-statements" in extra
                   else f"; max_prepared_statements: pgmemo's default (no such flag in --help)"))
    if "pgbouncer" in targets:
        binary = find_pgbouncer()
        if not binary:
            targets["pgbouncer"]["status"] = ("skipped: pgbouncer not installed "
                                              "(`apt-get install -y pgbouncer`)")
        else:
            setup["pgbouncer"] = binary
            ver = passthrough.version([binary, "--version"])
            vt = version_tuple(ver)
            setup["pgbouncer_version"] = ver
            setup["pgbouncer_prepared"] = bool(vt and vt[:2] >= PGBOUNCER_PREPARED_SINCE)
            settings = [f"max_prepared_statements = {MAX_PREPARED_STATEMENTS}"] \
                if setup["pgbouncer_prepared"] else []
            setup["pgbouncer_settings"] = settings
            targets["pgbouncer"]["note"] = (
                f"{ver} ({binary}); pool_mode = transaction, default_pool_size = {args.pool_size}, "
                f"max_client_conn = 1000, auth_type = trust, "
                f"host = {args.upstream_socket or PG_HOST}; "
                + (f"max_prepared_statements = {MAX_PREPARED_STATEMENTS}" if settings else
                   f"no max_prepared_statements before 1.21: -M prepared is expected to fail"))
    for t, info in targets.items():
        if info["status"].startswith("skipped"):
            log(f"{t}: {info['status']}")
    return setup, targets


def upstream_url(args):
    """pgmemo's upstream: PostgreSQL over TCP, or through its socket with --upstream-socket."""
    host = args.upstream_socket.replace("/", "%2F") if args.upstream_socket else PG_HOST
    return f"postgres://{PG_USER}@{host}:{PG_PORT}"


def start_proxy(name, setup, args, workdir):
    """Starts pgmemo or PgBouncer in transaction mode and waits until a query goes through."""
    if name == "pgmemo":
        proxy = passthrough.start_pgmemo(
            setup["pgmemo"], args.pool_size, "transaction", workdir, args.pgmemo_workers,
            extra_args=setup["pgmemo_args"], upstream=upstream_url(args))
    else:
        proxy = passthrough.start_pgbouncer(setup["pgbouncer"], args.pool_size, "transaction",
                                            workdir, extra_settings=setup["pgbouncer_settings"],
                                            upstream_host=args.upstream_socket)
    try:
        proxy.wait_ready(setup["tools"], timeout=20)
    except BenchError:
        proxy.stop()
        raise
    log(f"{name} ready on port {proxy.port} (pid {proxy.pid})")
    return proxy


def first_lines(text, n=6):
    lines = [ln for ln in str(text).splitlines() if ln.strip()]
    return " / ".join(lines[:n])[:600]


# ---------------------------------------------------------------------------------------------
# Runs

def clean(res):
    """A run counts when pgbench exited 0 with a tps and nothing failed, erred or aborted."""
    return bool(res.get("ok")) and not res.get("failed") and not res.get("errors") \
        and not res.get("aborted")


def proxy_exited(proxy):
    """Why `proxy` is gone, or None while it runs."""
    if proxy is None or proxy.popen.poll() is None:
        return None
    return (f"{proxy.name} exited (status {proxy.popen.returncode}); its log ends: "
            f"{first_lines(passthrough.tail(proxy.logfile, 5))}")


def failed_run(error):
    res = {"ok": False, "error": error, "errors": 0, "aborted": 0, "error_samples": [],
           "clean": False}
    for k in ("tps", "lat_ms", "txns", "failed", "cpu_s", "cpu_us_txn", "server_us_txn",
              "client_us_txn", "busy_us_txn", "idle_us_txn", "wall_s"):
        res[k] = None
    return res


def run_one(tools, port, clients, mode, duration, proxy):
    """passthrough.run_pgbench; a proxy that died or a pgbench that hung is a failed run."""
    gone = proxy_exited(proxy)
    if gone:
        return failed_run(f"not run: {gone}")
    try:
        res = passthrough.run_pgbench(tools, port, clients, mode, duration, proxy)
    except subprocess.TimeoutExpired:
        return failed_run(f"pgbench did not finish within {duration + 120}s (killed)")
    except (BenchError, OSError) as e:
        return failed_run(proxy_exited(proxy) or first_lines(e))
    res["clean"] = clean(res)
    if not res["clean"]:
        bits = []
        if res["failed"]:
            bits.append(f"{res['failed']:.0f} failed transactions")
        if res["errors"]:
            bits.append(f"{res['errors']} errors")
        if res["aborted"]:
            bits.append(f"{res['aborted']} clients aborted")
        sample = [re.sub(r"^pgbench: error: ", "", e) for e in res["error_samples"][:2]]
        if bits:  # pgbench's own first/last lines (its version, "Run was aborted") say less
            res["error"] = ", ".join(bits) + (": " + " / ".join(sample) if sample else "")
        elif sample:
            res["error"] = (res.get("error") or "pgbench failed") + ": " + " / ".join(sample)
        else:
            res.setdefault("error", "pgbench failed")
    return res


def log_run(progress, rnd, clients, mode, target, res):
    head = f"{progress} round {rnd + 1} c={clients} {mode} {target}"
    if res.get("skipped"):
        log(f"{head}: skipped ({res['skipped']})")
    elif res["clean"]:
        cpu = f", {res['cpu_us_txn']:.1f} µs CPU/txn" if res["cpu_us_txn"] is not None else ""
        if res.get("server_us_txn") is not None:
            cpu += (f" (PostgreSQL {res['server_us_txn']:.1f}, pgbench "
                    f"{res['client_us_txn']:.1f}, machine busy "
                    f"{res['busy_us_txn']:.1f}, idle {res['idle_us_txn']:.1f})")
        log(f"{head}: {res['tps']:,.0f} tps, {res['lat_ms']:.3f} ms{cpu}")
    else:
        tps = f" ({res['tps']:,.0f} tps from the clients left)" if res.get("tps") else ""
        log(f"{head}: FAILED{tps}: {res.get('error', '')}")


# ---------------------------------------------------------------------------------------------
# Summary and report

def summarize(args, setup, targets, runs):
    """Cells, ratios and bars from the runs. runs: list of dicts round/clients/mode/target/res."""
    by_cell = {}
    for run in runs:
        by_cell.setdefault((run["mode"], run["clients"], run["target"]), []).append(run)

    def cell(mode, clients, target):
        info = targets.get(target)
        if info is None:
            return {"status": "not selected", "display": "—", "tps": None, "by_round": {}}
        if info["status"] != "ran":
            why = info["status"]
            display = "did not start" if why.startswith("did not start") else "not run"
            return {"status": "not run", "note": why, "display": f"{display} (see Targets)",
                    "tps": None, "by_round": {}}
        rs = by_cell.get((mode, clients, target), [])
        skipped = [r for r in rs if r["res"].get("skipped")]
        if skipped or not rs:
            why = skipped[0]["res"]["skipped"] if skipped else "no run"
            return {"status": "skipped", "note": why, "display": f"skipped ({why})", "tps": None,
                    "by_round": {}}
        ok = {r["round"]: r["res"]["tps"] for r in rs if r["res"]["clean"]}
        n_bad = len(rs) - len(ok)
        if not ok:
            if target == "pgbouncer" and mode == "prepared" and not setup.get("pgbouncer_prepared"):
                ver = version_tuple(setup.get("pgbouncer_version"))
                vs = f"{ver[0]}.{ver[1]}" if ver else "this version"
                display = f"fails (no prepared-statement support in {vs})"
            else:
                display = "fails"
            first = next(r["res"] for r in rs)
            return {"status": "fails", "note": first.get("error", ""), "display": display,
                    "tps": None, "by_round": {}, "runs_failed": n_bad, "runs": len(rs)}
        tps = med(list(ok.values()))
        display = f"{tps:,.0f}" + (f" ({n_bad}/{len(rs)} runs failed)" if n_bad else "")
        return {"status": "ok" if not n_bad else "partly failed", "display": display, "tps": tps,
                "by_round": ok, "runs_failed": n_bad, "runs": len(rs)}

    def paired(a, b):
        both = sorted(set(a["by_round"]) & set(b["by_round"]))
        return med([a["by_round"][i] / b["by_round"][i] for i in both]) if both else None

    cells, rows = [], []
    for mode in args.modes:
        for clients in args.clients:
            c = {t: cell(mode, clients, t) for t in ALL_TARGETS}
            for t in ALL_TARGETS:
                if t in targets:
                    cells.append({"mode": mode, "clients": clients, "target": t,
                                  **{k: v for k, v in c[t].items() if k != "by_round"}})
            rows.append({"mode": mode, "clients": clients, "cells": c,
                         "pgmemo_over_pgbouncer": paired(c["pgmemo"], c["pgbouncer"]),
                         "pgmemo_over_direct": paired(c["pgmemo"], c["direct"])})

    prep = []
    if "extended" in args.modes and "prepared" in args.modes:
        for clients in args.clients:
            ext = next(r["cells"]["pgmemo"] for r in rows if r["mode"] == "extended" and r["clients"] == clients)
            pre = next(r["cells"]["pgmemo"] for r in rows if r["mode"] == "prepared" and r["clients"] == clients)
            prep.append({"clients": clients, "extended_tps": ext["tps"], "prepared_tps": pre["tps"],
                         "prepared_over_extended": paired(pre, ext)})

    bars = []
    for r in rows:
        m, b = r["cells"]["pgmemo"], r["cells"]["pgbouncer"]
        ratio = r["pgmemo_over_pgbouncer"]
        if m["tps"] is None:
            verdict = {"fails": "not met (pgmemo fails)", "not run": "n/a (pgmemo did not run)",
                       "skipped": "n/a"}.get(m["status"], "n/a")
        elif ratio is not None:
            verdict = "met" if ratio >= VS_PGBOUNCER_BAR else "not met"
        elif b["status"] == "fails":
            verdict = "met (PgBouncer fails)"
        else:
            verdict = "n/a"
        bars.append({"bar": f"pgmemo ≥ PgBouncer, -M {r['mode']}, {r['clients']} clients",
                     "measured": fmt(ratio, ".3f"), "needed": f"≥ {VS_PGBOUNCER_BAR:.2f}",
                     "result": verdict})
    for p in prep:
        ratio = p["prepared_over_extended"]
        verdict = "n/a" if ratio is None else ("met" if ratio > PREPARED_BAR else "not met")
        bars.append({"bar": f"pgmemo prepared faster than extended, {p['clients']} clients",
                     "measured": fmt(ratio, ".3f"), "needed": f"> {PREPARED_BAR:.2f}",
                     "result": verdict})
    return {"cells": cells, "rows": rows, "prepared_vs_extended": prep, "bars": bars}


def short(text, n=90):
    text = first_lines(text, 1)
    return text if len(text) <= n else text[:n - 1] + "…"


def md_escape(text):
    return str(text).replace("|", "\\|").replace("\n", " / ")


def cpu_section(rows, runs, proxies):
    """Where the CPU went per transaction, medians over clean runs: the proxy's own, all of
    PostgreSQL's processes, pgbench's, and the whole machine busy. tps moves with the machine's busy time
    per transaction, and on a shared machine most of its spread is PostgreSQL's, not the
    proxy's: this table tells the two apart."""
    if not proxies:
        return []
    lines = ["## CPU per transaction", "",
             "µs per transaction, medians over the clean runs: proxy / PostgreSQL (all its "
             "processes) / pgbench / machine busy (all CPUs, every process).", "",
             "| mode | clients | " + " | ".join(proxies) + " |",
             "|---|---:|" + "---:|" * len(proxies)]
    for r in rows:
        cells = []
        for t in proxies:
            ok = [run["res"] for run in runs
                  if (run["mode"], run["clients"], run["target"]) == (r["mode"], r["clients"], t)
                  and run["res"].get("clean")]
            parts = [med([x[k] for x in ok if x.get(k) is not None] or [None])
                     for k in ("cpu_us_txn", "server_us_txn", "client_us_txn", "busy_us_txn")]
            cells.append(" / ".join(fmt(v, ".1f") for v in parts))
        lines.append(f"| {r['mode']} | {r['clients']} | " + " | ".join(cells) + " |")
    return lines + [""]


def build_report(meta, targets, summary, runs):
    lines = [f"# pgmemo transaction-pooling benchmark, {meta['when']}", ""]
    lines += [f"- {k}: {v}" for k, v in meta["info"].items()]
    lines += ["", "Targets:", ""]
    for t in ALL_TARGETS:
        if t in targets:
            info = targets[t]
            lines.append(f"- {t}: " + (md_escape(info["note"]) if info["note"] else
                                       f"**{md_escape(info['status'])}**"))
            if info["status"] != "ran" and info["note"]:
                lines.append(f"  - **{md_escape(info['status'])}**")
    shown = [t for t in ALL_TARGETS if t in targets]
    lines += ["", "## tps", "",
              "Median tps over the rounds whose run was clean (pgbench exit 0, no failed "
              "transactions, no errors, no aborted clients). Ratios: the median over rounds of "
              "the ratio in the same round.", "",
              "| mode | clients | " + " | ".join(shown) + " | pgmemo / pgbouncer | pgmemo / direct |",
              "|---|---:|" + "---:|" * len(shown) + "---:|---:|"]
    for r in summary["rows"]:
        lines.append(f"| {r['mode']} | {r['clients']} | "
                     + " | ".join(md_escape(r["cells"][t]["display"]) for t in shown)
                     + f" | {fmt(r['pgmemo_over_pgbouncer'], '.3f')} | {fmt(r['pgmemo_over_direct'], '.3f')} |")
    lines.append("")
    lines += cpu_section(summary["rows"], runs, [t for t in ("pgmemo", "pgbouncer") if t in shown])
    if summary["prepared_vs_extended"] and "pgmemo" in targets:
        lines += ["## pgmemo: prepared against extended", "",
                  "| clients | extended tps | prepared tps | prepared / extended |",
                  "|---:|---:|---:|---:|"]
        for p in summary["prepared_vs_extended"]:
            lines.append(f"| {p['clients']} | {fmt(p['extended_tps'], ',.0f')} | "
                         f"{fmt(p['prepared_tps'], ',.0f')} | {fmt(p['prepared_over_extended'], '.3f')} |")
        lines.append("")
    lines += ["## The bar", "",
              "pgmemo at or above PgBouncer in every column (a column where PgBouncer fails and "
              "pgmemo does not counts as met), and pgmemo's `-M prepared` faster than `-M extended` "
              "at every client count. Judge it on a full run (3 rounds of 10 s) on a quiet machine.",
              "", "| bar | measured | needed | result |", "|---|---:|---:|---|"]
    lines += [f"| {b['bar']} | {b['measured']} | {b['needed']} | {b['result']} |" for b in summary["bars"]]
    lines += ["", "## Runs", "",
              "| round | mode | clients | target | tps | latency ms | txns | failed txns | errors "
              "| aborted clients | proxy CPU µs/txn | PostgreSQL CPU µs/txn | pgbench CPU µs/txn | machine busy µs/txn "
              "| machine idle µs/txn | note |",
              "|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for run in runs:
        r = run["res"]
        if r.get("skipped"):
            note = f"skipped: {r['skipped']}"
        else:
            note = "" if r["clean"] else "FAILED: " + short(r.get("error", ""), 200)
        lines.append(f"| {run['round'] + 1} | {run['mode']} | {run['clients']} | {run['target']} "
                     f"| {fmt(r.get('tps'), ',.0f')} | {fmt(r.get('lat_ms'), '.3f')} "
                     f"| {fmt(r.get('txns'), '.0f')} | {fmt(r.get('failed'), '.0f')} "
                     f"| {r.get('errors', 0)} | {r.get('aborted', 0)} "
                     f"| {fmt(r.get('cpu_us_txn'), '.1f')} | {fmt(r.get('server_us_txn'), '.1f')} "
                     f"| {fmt(r.get('client_us_txn'), '.1f')} "
                     f"| {fmt(r.get('busy_us_txn'), '.1f')} | {fmt(r.get('idle_us_txn'), '.1f')} "
                     f"| {md_escape(note)} |")
    lines.append("")
    return "\n".join(lines)


def write_json(path, args, meta, targets, summary, runs):
    rows = [{"mode": r["mode"], "clients": r["clients"],
             "tps": {t: r["cells"][t]["tps"] for t in ALL_TARGETS if t in targets},
             "display": {t: r["cells"][t]["display"] for t in ALL_TARGETS if t in targets},
             "pgmemo_over_pgbouncer": r["pgmemo_over_pgbouncer"],
             "pgmemo_over_direct": r["pgmemo_over_direct"]} for r in summary["rows"]]
    doc = {
        "benchmark": "txn_pool",
        "when": meta["when"],
        "info": meta["info"],
        "settings": {"duration_s": args.duration, "rounds": args.rounds, "clients": args.clients,
                     "jobs": PGBENCH_JOBS, "modes": args.modes, "pool_size": args.pool_size,
                     "scale": args.scale, "pgmemo_workers": args.pgmemo_workers,
                     "max_prepared_statements": MAX_PREPARED_STATEMENTS},
        "targets": targets,
        "table": rows,
        "cells": summary["cells"],
        "prepared_vs_extended": summary["prepared_vs_extended"],
        "bars": summary["bars"],
        "runs": [{"round": r["round"] + 1, "mode": r["mode"], "clients": r["clients"],
                  "target": r["target"], **r["res"]} for r in runs],
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------------------------------------
# Driving the run

def parse_args():
    def int_list(s):
        try:
            v = [int(x) for x in s.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a list of integers: {s!r}")
        if not v or min(v) < 1:
            raise argparse.ArgumentTypeError("client counts must be ≥ 1")
        return list(dict.fromkeys(v))

    def name_list(allowed):
        def parse(s):
            v = [x.strip() for x in s.split(",") if x.strip()]
            bad = [x for x in v if x not in allowed]
            if bad or not v:
                raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {','.join(allowed)}")
            return [x for x in allowed if x in v]  # canonical order
        return parse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--duration", type=int, default=10, help="seconds per pgbench run")
    p.add_argument("--rounds", type=int, default=3,
                   help="interleaved rounds; the report gives medians over them")
    p.add_argument("--clients", type=int_list, default=DEFAULT_CLIENTS,
                   help=f"comma-separated pgbench client counts (-c; -j is {PGBENCH_JOBS}, "
                        "or 1 for a single client)")
    p.add_argument("--modes", type=name_list(ALL_MODES), default=",".join(ALL_MODES),
                   help="pgbench -M query modes")
    p.add_argument("--targets", type=name_list(ALL_TARGETS), default=",".join(ALL_TARGETS),
                   help="what pgbench connects to")
    p.add_argument("--pool-size", type=int, default=8,
                   help="server connections of each proxy's pool (pgmemo --pool-size, PgBouncer "
                        "default_pool_size)")
    p.add_argument("--scale", type=int, default=10, help="pgbench scale of the database")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--target-dir", type=Path, default=DEFAULT_TARGET_DIR,
                   help="CARGO_TARGET_DIR of the pgmemo build")
    p.add_argument("--upstream-socket", metavar="DIR",
                   help="the proxies reach PostgreSQL through its Unix-domain socket in DIR "
                        "(e.g. /var/run/postgresql) instead of TCP; clients still use TCP")
    p.add_argument("--pgmemo-bin", help="use this pgmemo binary (no build)")
    p.add_argument("--no-build", action="store_true",
                   help="use TARGET_DIR/release/pgmemo as it is, build nothing")
    p.add_argument("--pgmemo-workers", type=int, default=1,
                   help="pgmemo --worker-threads (1, like PgBouncer's single thread; 0 = one per core)")
    p.add_argument("--pgmemo-promote", type=int, default=0, metavar="N",
                   help="pgmemo --max-promoted-statements N: unnamed statements seen again are "
                        "bound from statements pgmemo prepared (0, pgmemo's default: off)")
    a = p.parse_args()
    if min(a.duration, a.rounds, a.scale, a.pool_size) < 1:
        p.error("--duration, --rounds, --scale and --pool-size must be ≥ 1")
    a.target_dir = a.target_dir.resolve()
    return a


def main():
    args = parse_args()
    tools = {n: passthrough.find_tool(n) for n in ("pgbench", "psql")}
    for n, path in tools.items():
        if not path:
            raise BenchError(f"{n} not found (PATH, /usr/lib/postgresql/*/bin)")
    passthrough.prepare_db(tools, args.scale)
    setup, targets = resolve_targets(args, tools)

    proxies_wanted = [t for t in ("pgmemo", "pgbouncer")
                      if t in targets and not targets[t]["status"].startswith("skipped")]
    workdir = Path(tempfile.mkdtemp(prefix="pgmemo-txn-bench-"))
    proxies = {}
    try:
        for t in proxies_wanted:
            try:
                proxies[t] = start_proxy(t, setup, args, workdir)
                targets[t]["status"] = "ran"
            except (BenchError, OSError) as e:
                # The log's path is in the temporary directory, removed on exit: keep its text.
                why = re.sub(r"; log \S+:\n", ":\n", str(e))
                targets[t]["status"] = f"did not start: {first_lines(why, 8)}"
                log(f"error: {t} did not start:\n{e}")
        if "direct" in targets:
            targets["direct"]["status"] = "ran"
        running = [t for t in ALL_TARGETS if t in targets and targets[t]["status"] == "ran"]
        if not running:
            raise BenchError("no target could run: "
                             + "; ".join(f"{t}: {i['status']}" for t, i in targets.items()))
        ports = {"direct": PG_PORT, **{n: p.port for n, p in proxies.items()}}

        def planned(t, clients):
            return t != "direct" or clients <= setup["direct_limit"]

        runs_total = args.rounds * len(args.modes) * sum(
            1 for c in args.clients for t in running if planned(t, c))
        eta = runs_total * (args.duration + 1.5)
        log(f"{runs_total} runs of {args.duration}s: about {eta / 60:.0f} min" if eta >= 120
            else f"{runs_total} runs of {args.duration}s: about {eta:.0f} s")

        log("warm-up: 2s direct")
        passthrough.run_pgbench(tools, PG_PORT, min(max(args.clients), 8), "simple", 2, None)

        meta = {
            "when": datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"),
            "info": {
                "command": "python3 bench/txn_pool.py " + " ".join(sys.argv[1:]),
                "postgres": passthrough.psql(tools, "SHOW server_version") + f" on {PG_HOST}:{PG_PORT}, "
                            f"max_connections {passthrough.psql(tools, 'SHOW max_connections')}",
                "pgbench": passthrough.version([tools["pgbench"], "--version"]),
                "machine": f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start",
                "settings": f"pgbench -S -n -T {args.duration} -c C -j {PGBENCH_JOBS} -M MODE, scale "
                            f"{args.scale}, {args.rounds} round(s); proxies in transaction mode, pool "
                            f"of {args.pool_size} server connections, server_idle_timeout "
                            f"{passthrough.SERVER_IDLE_TIMEOUT_S}s",
            },
        }
        runs, n = [], 0
        for rnd in range(args.rounds):
            order = running[rnd % len(running):] + running[:rnd % len(running)]
            for clients in args.clients:
                for mode in args.modes:
                    for t in order:
                        if not planned(t, clients):
                            res = {"skipped": f"{clients} clients > max_connections "
                                              f"{setup['max_connections']} − 1", "clean": False}
                            runs.append({"round": rnd, "clients": clients, "mode": mode,
                                         "target": t, "res": res})
                            continue
                        n += 1
                        proxy = proxies.get(t)
                        if not proxy_exited(proxy):
                            passthrough.wait_for_slots(
                                tools, (clients if t == "direct" else args.pool_size) + 1)
                        res = run_one(tools, ports[t], clients, mode, args.duration, proxy)
                        runs.append({"round": rnd, "clients": clients, "mode": mode, "target": t,
                                     "res": res})
                        log_run(f"[{n}/{runs_total}]", rnd, clients, mode, t, res)

        summary = summarize(args, setup, targets, runs)
        report = build_report(meta, targets, summary, runs)
        passthrough.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        out = passthrough.RESULTS_DIR / f"txn-pool-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}.md"
        out.write_text(report)
        print(report)
        log(f"written to {out.relative_to(ROOT)}")
        if args.json:
            write_json(args.json, args, meta, targets, summary, runs)
            log(f"JSON written to {args.json}")
        for b in summary["bars"]:
            log(f"bar: {b['result']:8} {b['bar']}: {b['measured']} (needed {b['needed']})")
    finally:
        for p in proxies.values():
            p.stop()
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
