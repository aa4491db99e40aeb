#!/usr/bin/env bash
# The tests that say whether a Kubernetes release works with the operator and its chart, run on a local
# cluster of each release named (DDP_K8S_VERSION; default: every release cluster.sh builds but its
# default, on which the whole suite runs):
# the local cluster's own, the operator's cluster tests (admission refusals and Kueue included), the
# chart's (its ValidatingAdmissionPolicy with impersonated users included), the real node's and jobs in
# containers on it. Ends with one line per release: its passed and failed counts, and its time.
#
# Usage: scripts/k8s-versions.sh [RELEASE...]   (e.g. 1.30 1.34; PYTEST_ARGS are passed on)
# A local cluster that is up is taken down first: each release runs on a cluster of its own.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
cluster=localcluster/cluster.sh
releases=("$@")
if [ ${#releases[@]} -eq 0 ]; then
  mapfile -t releases < <(bash "$cluster" releases | grep -vx "$(env -u DDP_K8S_VERSION bash "$cluster" version)")
fi
suite=(
  tests/localcluster/test_local_cluster.py
  tests/operator/cluster
  tests/chart
  tests/localcluster/test_real_node.py
  tests/localcluster/test_real_node_jobs.py
  tests/localcluster/test_real_node_training.py::test_a_job_killed_three_ways_resumes_to_the_parameters_of_an_uninterrupted_one_on_the_same_master_port
  tests/localcluster/test_real_node_commands.py::test_torchrun_and_torch_distributed_launch_scripts_form_the_job_s_world_one_rank_a_pod_and_several
)
for wanted in "${releases[@]}"; do DDP_K8S_VERSION=$wanted bash "$cluster" version >/dev/null || exit 2; done
venv=$(scripts/venv.sh)
images/build.sh build
bash localcluster/kueue.sh build
"$venv/bin/python" localcluster/s3server.py build
bash localcluster/prometheus.sh build
reports=$(mktemp -d)
trap 'rm -rf "$reports"' EXIT
summary=()
failed=0
for wanted in "${releases[@]}"; do
  release=$(DDP_K8S_VERSION=$wanted bash "$cluster" version)
  bash "$cluster" down
  started=$SECONDS
  DDP_K8S_VERSION=$wanted bash "$cluster" build
  built=$((SECONDS - started))
  rc=0
  # shellcheck disable=SC2086  # PYTEST_ARGS are words
  DDP_K8S_VERSION=$wanted "$venv/bin/python" -m pytest -p no:cacheprovider --junitxml "$reports/$release.xml" \
    ${PYTEST_ARGS:-} "${suite[@]}" || rc=$?
  [ $rc -eq 0 ] || failed=1
  summary+=("$("$venv/bin/python" - "$reports/$release.xml" "$release" "$built" "$((SECONDS - started))" <<'EOF'
import sys
import xml.etree.ElementTree as ET

path, release, built, took = sys.argv[1:]
try:
    suite = ET.parse(path).getroot().find("testsuite")
except (OSError, ET.ParseError):
    print(f"Kubernetes {release}: no report (pytest did not run); {took} s")
    sys.exit()
total, failures, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
passed = total - failures - errors - skipped
print(f"Kubernetes {release}: {passed} passed, {failures} failed, {errors} errors, {skipped} skipped;"
      f" {took} s ({built} s of it building the cluster)")
EOF
)")
done
printf '[k8s-versions] %s\n' "${summary[@]}"
exit $failed
