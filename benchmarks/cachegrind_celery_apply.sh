#!/bin/sh
# Instructions per Celery `delay` in the producer process (our kombu transport; `--redis`/`--memory` for the
# peers), counted by cachegrind: runs of $BASE and $N delays (after the same warm-up), difference / (N-BASE).
# The broker child is not under valgrind. Usage: sh benchmarks/cachegrind_celery_apply.sh [--redis|--memory]
set -e
cd "$(dirname "$0")/.."
BASE=${BASE:-200}
N=${N:-1200}
PY=${PY:-/work/main/.venv/bin/python}
out=$(mktemp -d)
for n in $BASE $N; do
  PYTHONPATH=$PWD valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file="$out/cg.$n" \
    "$PY" benchmarks/profile_celery_apply.py --loop "$n" "$@" >/dev/null 2>"$out/err.$n"
done
a=$(grep '^summary:' "$out/cg.$BASE" | awk '{print $2}')
b=$(grep '^summary:' "$out/cg.$N" | awk '{print $2}')
echo "instructions: $BASE delays $a, $N delays $b, per delay $(( (b - a) / (N - BASE) ))"
rm -rf "$out"
