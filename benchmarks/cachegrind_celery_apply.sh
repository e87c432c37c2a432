#!/bin/sh
# Instructions per Celery `delay` in the producer's own thread (our kombu transport; `--redis`/`--memory` for
# the peers), counted by valgrind (callgrind, --separate-threads=yes: the main thread only, so the client's
# background threads, whose work follows the wall clock, do not count): runs of $BASE and $N delays after the
# same warm-up, difference / (N - BASE). The broker child is not under valgrind.
# Usage: sh benchmarks/cachegrind_celery_apply.sh [--redis|--memory]
set -e
cd "$(dirname "$0")/.."
BASE=${BASE:-200}
N=${N:-1200}
PY=${PY:-/work/main/.venv/bin/python}
out=$(mktemp -d)
for n in $BASE $N; do
  PYTHONPATH=$PWD valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$out/cg.$n" \
    "$PY" benchmarks/profile_celery_apply.py --loop "$n" "$@" >/dev/null 2>"$out/err.$n"
done
main() { grep -h '^totals:' "$1"-01 | awk '{print $2}'; }
all() { cat "$1"-* | grep '^totals:' | awk '{s += $2} END {printf "%d", s}'; }
a=$(main "$out/cg.$BASE"); b=$(main "$out/cg.$N")
A=$(all "$out/cg.$BASE"); B=$(all "$out/cg.$N")
echo "main thread: $BASE delays $a, $N delays $b, per delay $(( (b - a) / (N - BASE) )); all threads per delay $(( (B - A) / (N - BASE) ))"
rm -rf "$out"
