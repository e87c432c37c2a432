# Everything a fresh machine needs: each target creates .venv and installs the project into it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STORE ?= var/store

.PHONY: run demo quickstart test test-postgres lint bench bench-celery soak-celery crashtest txcrashtest timercrashtest racetest resiltest expirytest etatest clean native spark-jar

# pip builds the native core (setup.py: rmq_eventstore/_native.c, optional: without a C compiler the
# store runs its pure-Python loops) into the source tree, as the install is editable.
$(VENV)/.installed: pyproject.toml setup.py rmq_eventstore/_native.c rmq_eventstore/_spark_native.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]' --config-settings editable_mode=compat
	touch $@

## run: the whole stack on embedded defaults: the reference shop (django_app/) on http://127.0.0.1:8000/, a
## Celery worker with beat (celery_app/), and the broker of ./var/store (started by whichever needs it first,
## stops 5 min after its last client); SQLite in ./var. Ctrl-C stops the web server and the worker.
run: $(VENV)/.installed
	$(PY) django_app/run_stack.py

## demo: the broker on ./var/store (its own process), a demo producer and a long-polling consumer
demo: $(VENV)/.installed
	$(PY) examples/broker_demo.py --store $(STORE)

## quickstart: the embedded demo: a store under ./var/store, events in, read back by queue and by key
quickstart: $(VENV)/.installed
	$(PY) examples/quickstart.py --store $(STORE)

# The real ali-ons (npm) RocketMQ client used by tests/test_client_alions.py, from the committed lock file.
JS_CLIENT := tests/clients/js
$(JS_CLIENT)/node_modules/.installed: $(JS_CLIENT)/package.json $(JS_CLIENT)/package-lock.json
	npm ci --prefix $(JS_CLIENT) --no-audit --no-fund
	touch $@

# Debian's chromium and chromium-driver for the dashboard's browser test (tests/django_face/test_dashboard.py),
# installed only when the driver is missing (the file is the stamp); root runs apt-get itself, others via sudo.
CHROMEDRIVER := /usr/bin/chromedriver
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
$(CHROMEDRIVER):
	$(SUDO) apt-get update && $(SUDO) apt-get install -y chromium chromium-driver

## chromium: the browser the dashboard's Selenium test drives (apt-get, when missing)
.PHONY: chromium
chromium: $(CHROMEDRIVER)

## native: (re)build the native core (rmq_eventstore._native, rmq_eventstore._spark_native) in place
native: $(VENV)/.installed
	$(PY) -m pip install --quiet --no-deps -e . --config-settings editable_mode=compat
	$(PY) -c "from rmq_eventstore.common import codec; assert codec.NATIVE, 'the native core did not build'"
	$(PY) -c "from rmq_eventstore.spark import decode; assert decode.NATIVE, 'the Spark scan (_spark_native) did not build'"

## spark-jar: (re)build the JVM reader of the Spark source (`format("rocketmq-jvm")`, rmq_eventstore/spark/java)
## into rmq_eventstore/spark/jars/ with the JDK's javac against pyspark's jars; without javac it says so and
## skips (everything then runs on the Python source, `format("rocketmq")`)
spark-jar: $(VENV)/.installed
	$(PY) -m rmq_eventstore.spark.jvm build

# The files whose tests run a second time on the pure-Python loops (RMQ_EVENTSTORE_PURE=1): the golden
# vectors, the codec property tests, the native-vs-Python comparisons, the index file (put_keys against
# put_key), the crash suite (CI's 50 rounds), the Spark decoder (numpy instead of _spark_native) and the
# remoting frame codec (Python's encode/decode instead of _native's remoting block).
PURE_TESTS := tests/test_codec_golden.py tests/test_codec_properties.py tests/test_native.py tests/test_single_put.py tests/test_index.py \
	tests/test_pull_native.py tests/test_message_store_read_runs.py \
	tests/test_crash.py tests/spark/test_spark_decode.py tests/spark/test_spark_native.py \
	tests/test_remoting.py tests/test_remoting_fastpath.py tests/test_remoting_native.py tests/test_remoting_client.py \
	tests/test_batch_native.py tests/test_single_put_net.py tests/test_pop.py tests/test_pop_native.py \
	tests/test_pop_lane.py tests/test_pop_client_native.py tests/test_client_send_native.py tests/test_kombu_publish_fastpath.py \
	tests/test_half_lane.py tests/test_half_lane_client.py tests/test_end_lane.py tests/test_send_core_net.py \
	tests/test_producer_send_budget.py tests/test_client_lone.py tests/test_pop_read.py tests/test_pop_buffer_flush.py tests/test_pop_revive_due.py tests/test_pop_hold.py

## test: lint, then every test (the Django face on SQLite, then again on the local PostgreSQL), then the
## codec and crash tests again on the pure-Python loops (the first pass requires the native core), and the
## broker's wire tests again on asyncio's own loop (the dev install serves on uvloop)
test: $(VENV)/.installed $(JS_CLIENT)/node_modules/.installed chromium spark-jar lint
	RMQ_EVENTSTORE_REQUIRE_NATIVE=1 $(PY) -m pytest -q
	RMQ_TEST_DB=postgres $(PY) -m pytest -q tests/django_face
	RMQ_EVENTSTORE_PURE=1 $(PY) -m pytest -q $(PURE_TESTS)
	RMQ_EVENTSTORE_EVENT_LOOP=asyncio $(PY) -m pytest -q tests/test_broker.py tests/test_broker_loop.py \
		tests/test_remoting_client.py tests/test_client_alions.py tests/test_client_cpp.py

## test-postgres: the Django face's tests on the local PostgreSQL only
test-postgres: $(VENV)/.installed
	RMQ_TEST_DB=postgres $(PY) -m pytest -q tests/django_face

## lint: ruff, and the layer rules of pyproject.toml's import-linter contracts
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

## bench: every speed goal in one run, side by side with the peers (bench_all.py: store, sweep, broker, POP,
## recovery/verify, Spark; writes benchmarks/results/run-<date>/ and the table in benchmarks/README.md; QUICK=1: short)
## Two runs back to back (RUNS=N to change; QUICK=1 runs once): the table shows both, met = met in every run
bench: $(VENV)/.installed
	$(PY) benchmarks/bench_all.py $(if $(QUICK),--quick --runs $(or $(RUNS),1),--runs $(or $(RUNS),2))

## bench-celery: Celery on our transport vs Celery on the local Redis and RabbitMQ, one run (QUICK=1: short)
bench-celery: $(VENV)/.installed
	$(PY) benchmarks/bench_celery.py $(if $(QUICK),--quick)

## soak-celery: 1,000,000 tasks through 4 workers on our transport: every task once, RSS plotted
## (SOAK_TASKS=N, SOAK_MINUTES=M stops publishing after M minutes)
soak-celery: $(VENV)/.installed
	$(PY) benchmarks/soak_celery.py --tasks $${SOAK_TASKS:-1000000} $(if $(SOAK_MINUTES),--max-minutes $(SOAK_MINUTES))

## crashtest: the SIGKILL crash suite with 1000 rounds (CI runs 50; CRASH_SEED=N reproduces a run)
crashtest: $(VENV)/.installed
	CRASH_ROUNDS=$${CRASH_ROUNDS:-1000} $(PY) -m pytest -q -s --timeout=0 tests/test_crash.py  # ~15 min

## txcrashtest: transactions across 200 SIGKILLs of the broker (CI runs 4; TX_CRASH_SEED=N reproduces a run)
txcrashtest: $(VENV)/.installed
	TX_CRASH_ROUNDS=$${TX_CRASH_ROUNDS:-200} $(PY) -m pytest -q -s --timeout=0 tests/test_transaction_crash.py

## timercrashtest: timers across 50 SIGKILLs of the broker (TIMER_CRASH_SEED=N reproduces a run)
timercrashtest: $(VENV)/.installed
	TIMER_CRASH_ROUNDS=$${TIMER_CRASH_ROUNDS:-50} $(PY) -m pytest -q -s --timeout=0 tests/test_timer.py -k kills

## celery-suite: Celery 5.7's own integration tests (test_inspect, test_worker, test_tasks) against a broker
## process, Redis on 127.0.0.1:6379 db 11 as result backend; prints each module's time (part of `make test` too)
.PHONY: celery-suite
celery-suite: $(VENV)/.installed
	$(PY) -m pytest -q -s tests/test_celery_integration.py

## racetest: 16 writer processes racing at one expected version, 1000 rounds, also through broker kills
racetest: $(VENV)/.installed
	STREAM_RACE_ROUNDS=$${STREAM_RACE_ROUNDS:-1000} $(PY) -m pytest -q -s --timeout=0 tests/test_stream_version.py -k racing

## expirytest: 10,000 Celery remote-control pings (each with its own reply queue) against a running worker leave
## no reply topic behind; prints counts and time (EXPIRY_PINGS=N; tests/test_kombu_expiry.py runs 200)
expirytest: $(VENV)/.installed
	$(PY) benchmarks/celery_inspect_expiry.py --pings $${EXPIRY_PINGS:-10000}

## resiltest: every variant of the Celery at-least-once tests (worker and broker SIGKILLs, silent network
## stalls; ~4 min; CI runs one variant per guarantee)
resiltest: $(VENV)/.installed
	CELERY_RESILIENCE_FULL=1 $(PY) -m pytest -q -s tests/test_celery_resilience.py

## etatest: 10,000 Celery tasks with etas up to 10 minutes through the broker's timers (chained past a 120 s
## timerMaxDelaySec), workers replaced every 40 s (SIGTERM, some SIGKILL): each runs once, within 1 s of its
## eta; prints lateness p50/p99, missing, duplicates (~12 min; ETA_SOAK_TASKS=N, ETA_SOAK_HORIZON=S)
etatest: $(VENV)/.installed
	ETA_SOAK=1 $(PY) -m pytest -q -s --timeout=0 tests/test_celery_eta.py -k soak

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache .hypothesis $(JS_CLIENT)/node_modules rmq_eventstore/spark/jars

# kombu's integration mixins and Celery's integration tests come from their sdists, unpacked into .cache/
# (never committed); tests/test_kombu_integration.py and tests/test_celery_integration.py do this themselves.
.PHONY: upstream-sdists
upstream-sdists: $(VENV)/.installed
	$(PY) tests/upstream.py
