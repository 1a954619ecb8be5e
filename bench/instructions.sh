#!/usr/bin/env bash
# Instructions pgmemo executes per transaction, counted by callgrind: unlike tps or CPU time
# this does not move with what else the machine is doing, so it shows what a code change
# costs or saves. Counters are zeroed after a warm-up run (connections made, statements
# prepared) and dumped after the measured run.
#
#   bash bench/instructions.sh [options] -- [pgmemo flags]
#     --script FILE     pgbench script (default: a primary-key lookup over all 1M rows)
#     --mode M          pgbench -M (simple, extended, prepared; default prepared)
#     --clients N       pgbench clients (default 8)
#     --txns N          transactions per client in the measured run (default 2000)
#     --bin PATH        pgmemo binary (default ../target-bench/release/pgmemo)
#     --keep            keep callgrind's output file (for callgrind_annotate)
#     --pgbouncer MODE  measure PgBouncer instead (pool_mode MODE: session or transaction,
#                       default_pool_size 8; pgmemo flags after -- are ignored)
#   e.g. bash bench/instructions.sh --mode simple -- --cache on --pool-size 8
#        bash bench/instructions.sh --mode extended --pgbouncer transaction
#
# Needs valgrind, pgbench and the database pgmemo_bench (bench/run.py creates it). Under
# callgrind pgmemo runs ~50x slower: timing-based decisions (cache admission's
# cache_costly_miss, single flight) can differ from a normal run.
set -euo pipefail
cd "$(dirname "$0")/.."
script="" mode=prepared clients=8 txns=2000 keep=0 pgbouncer=""
bin="$(cd .. && pwd)/target-bench/release/pgmemo"
while [ $# -gt 0 ]; do
  case "$1" in
    --script) script=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --txns) txns=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --pgbouncer) pgbouncer=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
PATH=/usr/lib/postgresql/15/bin:$PATH
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 2; }
work=$(mktemp -d)
trap 'kill -KILL ${pid:-0} 2>/dev/null || true; [ $keep = 1 ] || rm -rf "$work"' EXIT
if [ -z "$script" ]; then
  script=$work/lookup.sql
  printf '\\set aid random(1, 1000000)\nSELECT abalance FROM pgbench_accounts WHERE aid = :aid;\n' > "$script"
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# PgBouncer refuses to run as root: then it and callgrind_control run as postgres.
as_owner=()
if [ -n "$pgbouncer" ]; then
  command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || { echo "pgbouncer is not installed" >&2; exit 2; }
  printf '"postgres" ""\n' > "$work/userlist.txt"
  cat > "$work/pgbouncer.ini" <<INI
[databases]
pgmemo_bench = host=127.0.0.1 port=5432 dbname=pgmemo_bench
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $work/userlist.txt
pool_mode = $pgbouncer
default_pool_size = 8
max_client_conn = 1000
ignore_startup_parameters = extra_float_digits,options
logfile = $work/pgbouncer.log
log_connections = 0
log_disconnections = 0
INI
  if [ "$(id -u)" = 0 ]; then
    chmod 755 "$work" && chown -R postgres "$work"
    as_owner=(runuser -u postgres --)
  fi
  "${as_owner[@]}" valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out" \
    "$(command -v pgbouncer || echo /usr/sbin/pgbouncer)" "$work/pgbouncer.ini" > "$work/proxy.log" 2>&1 &
else
  valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out" \
    "$bin" --listen "127.0.0.1:$port" --worker-threads 1 --log-level warn "$@" > "$work/proxy.log" 2>&1 &
fi
pid=$!
for _ in $(seq 150); do (echo > "/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.2; done
# With runuser in between, the PID to talk to is valgrind's own, runuser's child.
if [ ${#as_owner[@]} -gt 0 ]; then pid=$(pgrep -P "$pid" | head -1); fi
bench() { pgbench -n -h 127.0.0.1 -p "$port" -U postgres -f "$script" -c "$clients" -j 2 -M "$mode" -t "$1" pgmemo_bench; }
bench 100 > /dev/null 2>&1
"${as_owner[@]}" callgrind_control -z "$pid" > /dev/null 2>&1
bench "$txns" > "$work/pgbench.log" 2>&1 || { cat "$work/pgbench.log" >&2; exit 1; }
"${as_owner[@]}" callgrind_control -d "$pid" > /dev/null 2>&1
sleep 0.5
out=$(ls -t "$work"/callgrind.out* | head -1)
total=$(callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
echo "instructions per transaction: $(( total / (clients * txns) ))"
if [ $keep = 1 ]; then echo "callgrind output: $out"; fi
