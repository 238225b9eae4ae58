#!/usr/bin/env bash
# Multi-node data parallelism over a real network: two network namespaces joined by a veth pair, each a
# "node" running dpt-run --nnodes 2 with 2 workers on Gloo (4 ranks).
#   1. DDP parity: the parity worker (tests/distributed/workers/ddp_parity.cpp) trains an MLP and a tiny
#      GPT on every rank and checks each step against the single-process run on the whole batch.
#   2. Link cut: a long DDP run (tests/reliability/workers/fault_worker.cpp); once both nodes are
#      training, the veth link goes down; each node's ranks must end with an error (or be stopped by
#      their launcher after a sibling's error) within about the collective timeout, and both launchers
#      must exit non-zero.
# Needs root (ip netns, veth); prints "netns-test: skipped: ..." and exits 0 where that is not permitted.
# Uses the binaries of $DPT_BUILD_DIR (default build/).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${DPT_BUILD_DIR:-$root/build}/bin"
for b in dpt-run dpt_test_ddp_parity dpt_test_fault_worker; do
  [[ -x "$bin/$b" ]] || { echo "netns-test: $bin/$b not built" >&2; exit 1; }
done

tag="$$"
ns0="dpt_n0_$tag" ns1="dpt_n1_$tag" v0="dptv0_$tag" v1="dptv1_$tag"
v0="${v0:0:15}" v1="${v1:0:15}"
addr0=10.231.0.1 addr1=10.231.0.2
logs="$(mktemp -d)"

if ! ip netns add "$ns0" 2>/dev/null; then
  echo "netns-test: skipped: 'ip netns add' is not permitted here (needs root or CAP_SYS_ADMIN)"
  exit 0
fi
cleanup() {
  ip netns pids "$ns0" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns pids "$ns1" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns del "$ns0" 2>/dev/null || true
  ip netns del "$ns1" 2>/dev/null || true
  rm -rf "$logs"
}
trap cleanup EXIT
ip netns add "$ns1"
ip link add "$v0" type veth peer name "$v1"
ip link set "$v0" netns "$ns0"
ip link set "$v1" netns "$ns1"
ip -n "$ns0" addr add "$addr0/24" dev "$v0"
ip -n "$ns1" addr add "$addr1/24" dev "$v1"
for n in "$ns0" "$ns1"; do ip -n "$n" link set lo up; done
ip -n "$ns0" link set "$v0" up
ip -n "$ns1" link set "$v1" up

failures=0
fail() { echo "netns-test: FAIL: $*" >&2; failures=$((failures + 1)); }

# node NS RANK LOG ARGS...: one node's dpt-run in the background; its pid goes to $node_pid.
node() {
  local ns="$1" rank="$2" log="$3"
  shift 3
  ip netns exec "$ns" timeout 300 "$bin/dpt-run" --nnodes 2 --node-rank "$rank" --nproc-per-node 2 \
    --master-addr "$addr0" --master-port 29555 --grace-period 2 -- "$@" >"$log" 2>&1 &
  node_pid=$!
}

# 1. Parity across the two nodes.
for model in mlp gpt; do
  node "$ns0" 0 "$logs/p0" "$bin/dpt_test_ddp_parity" "$model" default cpu
  p0=$node_pid
  node "$ns1" 1 "$logs/p1" "$bin/dpt_test_ddp_parity" "$model" default cpu
  p1=$node_pid
  rc0=0 rc1=0
  wait "$p0" || rc0=$?
  wait "$p1" || rc1=$?
  passed=$(cat "$logs/p0" "$logs/p1" | grep -c "$model default passed" || true)
  if [[ $rc0 -ne 0 || $rc1 -ne 0 || $passed -ne 4 ]]; then
    fail "DDP parity ($model) over veth: node exits $rc0 and $rc1, $passed of 4 ranks passed"
    cat "$logs/p0" "$logs/p1" >&2
  else
    echo "netns-test: DDP parity ($model, 2 nodes x 2 ranks over veth) OK"
  fi
done

# 2. Cut the link mid-run.
timeout_ms=4000
node "$ns0" 0 "$logs/c0" "$bin/dpt_test_fault_worker" --steps 1000000 --step-ms 20 --timeout-ms "$timeout_ms"
c0=$node_pid
node "$ns1" 1 "$logs/c1" "$bin/dpt_test_fault_worker" --steps 1000000 --step-ms 20 --timeout-ms "$timeout_ms"
c1=$node_pid
for _ in $(seq 1 300); do
  if grep -q "\[1\]: step 20$" "$logs/c0" 2>/dev/null && grep -q "\[3\]: step 20$" "$logs/c1" 2>/dev/null; then break; fi
  sleep 0.1
done
if ! grep -q "\[3\]: step 20$" "$logs/c1"; then
  fail "the long run did not start on both nodes"
  cat "$logs/c0" "$logs/c1" >&2
fi
ip -n "$ns0" link set "$v0" down
cut_at=$(date +%s)
rc0=0 rc1=0
wait "$c0" || rc0=$?
wait "$c1" || rc1=$?
took=$(($(date +%s) - cut_at))
# Within a node, dpt-run stops the other worker once one fails (its report names the root cause), so
# each node must show at least one rank's own error; no rank may outlive its launcher.
errors0=$(grep -cE "^\[[01]\]: error: Gloo " "$logs/c0" || true)
errors1=$(grep -cE "^\[[23]\]: error: Gloo " "$logs/c1" || true)
if [[ $rc0 -eq 0 || $rc1 -eq 0 || $rc0 -ge 124 || $rc1 -ge 124 || $errors0 -lt 1 || $errors1 -lt 1 ]]; then
  fail "link cut: node exits $rc0 and $rc1 (both must fail, not hang); rank errors: $errors0 on node 0, $errors1 on node 1"
  cat "$logs/c0" "$logs/c1" >&2
else
  echo "netns-test: link cut ended both nodes (exit codes $rc0, $rc1) within ${took}s (collective timeout $((timeout_ms / 1000))s):"
  grep -hE "^\[[0-3]\]: error: |rank       :" "$logs/c0" "$logs/c1" | sed 's/^/netns-test:   /'
fi
if ((failures > 0)); then
  echo "netns-test: $failures failure(s)" >&2
  exit 1
fi
echo "netns-test: all OK"
