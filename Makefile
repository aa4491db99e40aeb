# Entry points; DEVELOPMENT.md says what each is for.
SHELL := /bin/bash
CLUSTER := localcluster/cluster.sh
KUEUE := bash localcluster/kueue.sh
PYTEST_ARGS ?=
# make test's pytest-xdist workers (0: one process). The tests on the cluster mostly wait on it, so more
# workers than cores pay; DEVELOPMENT.md#tests says how they share the cluster.
PYTEST_WORKERS ?= 3

BENCH_ARGS ?=

.PHONY: demo example images bench-data bench-checkpoint bench-goodput bench-kept bench-dashboard bench-learning bench-printscan bench-command bench-dataworkers bench-train bench-operator bench-statuspass bench-real-node bench-elastic chart-check crds lint test test-unit test-k8s-versions cluster-build cluster-up cluster-down cluster-status cluster-env venv

# On a first run the control plane compiles while the virtualenv (one core, mostly downloads) is made;
# the demo's own build step then waits for it (each component is built once at a time, gocache.sh).
# The demo's ranks run on the real node: it neither builds nor starts kwok's fake nodes (DDP_NODES=0);
# a later `make test` adds them to the cluster it left up.
demo:
	@export DDP_NODES=$${DDP_NODES:-0} && logs=$${DDP_CACHE:-$$HOME/.cache/ddp-operator}/demo && mkdir -p $$logs && \
	  { bash $(CLUSTER) build >$$logs/cluster-build.log 2>&1 & } && \
	  venv=$$(scripts/venv.sh) && $$venv/bin/python localcluster/demo.py

# One of examples/<name>/ end to end (data step, DDPJob, outcome): make example NAME=petnames
NAME ?=
example:
	@venv=$$(scripts/venv.sh) && $(CLUSTER) build && $$venv/bin/python localcluster/example.py $(NAME)

# Everything is built here, before pytest, so that each build says what it does (the tests' own
# build of the images, which imports them into the node, then finds them made).
test:
	@venv=$$(scripts/venv.sh) && scripts/build-for-tests.sh "$$venv" && \
	  $$venv/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=30 $(PYTEST_ARGS)

# ruff (lint, import order), mypy (types) and import-linter (the operator never imports the runtime).
lint:
	@venv=$$(scripts/venv.sh) && $$venv/bin/ruff check . && $$venv/bin/mypy && \
	  PYTHONPATH=contract:operator:images/trainer:client $$venv/bin/lint-imports

# The operator's cluster, chart, admission and real-node tests on the Kubernetes releases other than the
# default, a cluster of each: make test-k8s-versions [K8S_VERSIONS="1.30 1.34"]
K8S_VERSIONS ?=
test-k8s-versions:
	@scripts/k8s-versions.sh $(K8S_VERSIONS)

test-unit:
	@venv=$$(scripts/venv.sh) && $$venv/bin/python localcluster/s3server.py build && bash localcluster/prometheus.sh build && \
	  $$venv/bin/python -m pytest -m "not cluster and not images" $(PYTEST_ARGS)

bench-data:
	@venv=$$(scripts/venv.sh) && $$venv/bin/python benchmarks/bench_data.py $(BENCH_ARGS)

# Snapshots in the pod's memory: their cost a step, and what faults cost a job on the real node.
bench-goodput:
	@venv=$$(scripts/venv.sh) && $$venv/bin/python benchmarks/bench_goodput.py $(BENCH_ARGS)

# Checkpoint save and load against the real S3 server, next to s3torchconnector and DCP.
bench-checkpoint:
	@venv=$$(scripts/venv.sh) && $$venv/bin/python localcluster/s3server.py build && \
	  $$venv/bin/python benchmarks/bench_checkpoint.py $(BENCH_ARGS)

bench-kept:
	@venv=$$(scripts/venv.sh) && $$venv/bin/python localcluster/s3server.py build && \
	  $$venv/bin/python benchmarks/bench_kept.py $(BENCH_ARGS)

# The dashboard with hundreds of jobs, a job of 1,024 ranks and a long curve, in Chromium (needs the local cluster up).
bench-dashboard:
	@venv=$$(scripts/venv.sh) && $$venv/bin/python localcluster/s3server.py build && scripts/chromium.sh >/dev/null && \
	  $$venv/bin/python benchmarks/bench_dashboard.py $(BENCH_ARGS)

# Every learning test's workload at several seeds and thread counts, its worst outcome next to the test's bar.
bench-learning:
	@venv=$$(scripts/venv.sh) && $$venv/bin/python benchmarks/learning_margins.py $(BENCH_ARGS)

# What reading a rank's output for metric lines costs, at 1000 lines a second.
bench-printscan:
	@venv=$$(scripts/venv.sh) && $$venv/bin/python benchmarks/bench_printscan.py $(BENCH_ARGS)

# A user's torchrun script as a job's command, bare and under the trainer runtime (a GPU; CPUs with smaller BENCH_ARGS).
bench-command:
	@venv=$$(scripts/venv.sh) && $$venv/bin/python benchmarks/bench_command.py $(BENCH_ARGS)

# ResNet-50 on one GPU fed by ShardStream next to synthetic data (the CPU runs it with BENCH_ARGS="--device cpu --model resnet18 ...").
bench-train:
	@venv=$$(scripts/venv.sh) && $$venv/bin/python benchmarks/bench_train.py $(BENCH_ARGS)

bench-operator:
	@venv=$$(scripts/venv.sh) && $(CLUSTER) build && $$venv/bin/python benchmarks/bench_operator.py $(BENCH_ARGS)

bench-statuspass:
	@venv=$$(scripts/venv.sh) && $$venv/bin/python benchmarks/bench_statuspass.py $(BENCH_ARGS)

bench-dataworkers:
	@venv=$$(scripts/venv.sh) && $(CLUSTER) build && $$venv/bin/python benchmarks/bench_dataworkers.py $(BENCH_ARGS)

# Set-up, apply-to-first-step and gang restarts in containers on the local cluster's real node (BENCH_ARGS=--node-setup).
bench-real-node:
	@venv=$$(scripts/venv.sh) && $(CLUSTER) build && $$venv/bin/python benchmarks/bench_real_node.py $(BENCH_ARGS)

# An elastic job losing a node and getting it back, next to one without minWorldSize (pod-runner nodes).
bench-elastic:
	@venv=$$(scripts/venv.sh) && $(CLUSTER) build && $$venv/bin/python benchmarks/bench_elastic.py $(BENCH_ARGS)

chart-check:
	@scripts/sync-crds.sh --check && $$($(CLUSTER) bindir | cut -d: -f2)/helm lint --strict charts/

crds:
	@scripts/sync-crds.sh

venv:
	@scripts/venv.sh

# The operator image and the trainer's CPU variant, built with BuildKit without Docker (images/build.sh),
# loaded into the local node; with REGISTRY=host[:port][/path] pushed there instead, as
# REGISTRY/ddp-operator/<name>:<tag>, with the Docker config's credentials and REGISTRY_CA (a PEM file)
# trusted for it, layers compressed with PUSH_COMPRESSION (zstd or gzip). Set here so that only the
# command line sets them, never a stray environment variable.
REGISTRY =
REGISTRY_CA =
PUSH_COMPRESSION = zstd
images:
	@$(if $(REGISTRY),PUSH_COMPRESSION='$(PUSH_COMPRESSION)' images/build.sh push '$(REGISTRY)' '$(REGISTRY_CA)',images/build.sh build)

cluster-build:
	@$(CLUSTER) build && $(KUEUE) build

cluster-up:
	@$(CLUSTER) up

cluster-down:
	@$(CLUSTER) down

cluster-status:
	@$(CLUSTER) status

cluster-env:
	@$(CLUSTER) env
