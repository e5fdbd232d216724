#!/usr/bin/env bash
# One lease of a GPU host, prepared: run it there from the repository root, with `.gpu/` made
# here by `python benchmarks/gpu_pack.py [--cleanrl-checkout DIR]` and carried along.
#
#   bash benchmarks/gpu_session.sh [STAGE...]  STAGE: tests peers graphs overlap restart compile
#                                              precision learn
#                                              (default: tests peers)
#
# - tests: `pytest tests/gpu` (each learner trains and resumes on cuda:0, the no-sync check under
#   CUDA's sync checker, OOM, the memory gate under a real `rlsup run`);
# - peers: benchmarks/peers.py --device cuda against CleanRL's scripts at their settings
#   (PEER_STEPS agent steps a side, default 61,440 for PPO/PQN and 15,000 for DQN);
# - graphs: the peers' rows again with each gradient step and acting forward as a CUDA graph
#   (`--cuda-graphs on`, GRAPH_ALGOS, default ppo,pqn,dqn), against the peers stage's rlsup rows;
# - overlap: the peers' PPO and PQN rows again with their envs in two halves stepped in turn
#   (`--env-overlap on`, with OVERLAP_ARGS, e.g. "--cuda-graphs on");
# - restart: kill -> first training step of a PPO worker on the GPU, eager against --cuda-graphs
#   on and --compile default / reduce-overhead, cold and restarted from its checkpoint and
#   compile cache (benchmarks/gpu_restart.py, RESTART_ALGO);
# - compile: the peers' PPO and PQN rows again with rlsup's networks compiled (`--compile`,
#   COMPILE_MODES, default reduce-overhead then default), to keep what wins;
# - precision: the peers' rows again with rlsup in fp32 + TF32 (`--precision fp32`) against
#   the default bf16 autocast, to choose per device;
# - learn: the learning table on the GPU (benchmarks/learning.py --algos LEARN_ALGOS --device
#   cuda, LEARN_STEPS, default 500,000: minutes for PPO/PQN, too long for DQN in one lease).
#
# Everything lands in benchmarks/results/gpu-session-DATE/ (and $OUT's archive): the host
# (nvidia-smi, torch's build), each stage's log and JSON. Each stage runs even if one before it
# failed; the exit status is the first failure's. Sized for a 15-minute lease: tests about 5
# minutes, peers about 6 (DQN's two sides are most of it); after peers, each variant stage runs
# rlsup's side only (about 3 minutes for three rows). A lease: `tests peers graphs`, the next
# one `peers overlap restart precision` (peers again: a new lease is a new host).
set -uo pipefail
cd "$(dirname "$0")/.."
# Everything is written to one folder; on the device tool's machine (OUT set there, and at
# most 8 files come back) it is also packed into $OUT/gpu-session-DATE.tgz.
STAMP=$(date -u +%Y-%m-%d)
RES="benchmarks/results/gpu-session-$STAMP"
mkdir -p "$RES"
export PYTHONPATH="$PWD/.gpu/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(tests peers)
status=0

if [ ! -d .gpu/site ]; then
  echo "no .gpu/site: run python benchmarks/gpu_pack.py here first, and carry .gpu" >&2
  exit 2
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import torch, json; print(json.dumps({"torch": torch.__version__,
    "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
    "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))'
} > "$RES/gpu-host-$STAMP.txt" 2>&1
cat "$RES/gpu-host-$STAMP.txt"

# The peers table's own settings, the same in every stage that runs it: the PQN peer's
# checkout (without it that row is skipped) and PEER_STEPS.
peer_dir=()
[ -d .gpu/pqnpeer ] && peer_dir=(--peer-dir "$PWD/.gpu/pqnpeer")
steps=()
[ -n "${PEER_STEPS:-}" ] && steps=(--steps "$PEER_STEPS")

# peers NAME [peers.py flags...]: the peers table into $RES/peers-cuda[-NAME]-DATE.{log,json};
# its exit status.
peers() {
  local out="$RES/peers-cuda${1:+-$1}-$STAMP"
  shift
  python3 benchmarks/peers.py --device cuda --peer-python "$PWD/.gpu/peerpy" --threads 4 \
    "${peer_dir[@]}" "${steps[@]}" "$@" 2>&1 | tee "$out.log"
  local rc=${PIPESTATUS[0]}
  tail -n 1 "$out.log" > "$out.json"
  return "$rc"
}

# variant NAME ALGOS RLSUP_FLAGS: rlsup's side again with RLSUP_FLAGS, reusing the peers
# stage's CleanRL runs where it ran first in this session (peers.py --peer-from).
variant() {
  local earlier="$RES/peers-cuda-$STAMP.json" from=()
  [ -s "$earlier" ] && from=(--peer-from "$earlier")
  peers "$1" "${from[@]}" --algos "$2" --rlsup-args "$3"
}

for stage in "${stages[@]}"; do
  echo "== $stage ($(date -u +%T))"
  case $stage in
    tests)
      python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$RES/gpu-tests-$STAMP.log"
      rc=${PIPESTATUS[0]}
      ;;
    peers)
      peers ""
      rc=$?
      ;;
    graphs)
      # rlsup's side again with its steps replayed as CUDA graphs: keep what wins.
      variant graphs "${GRAPH_ALGOS:-ppo,pqn,dqn}" "--cuda-graphs on ${GRAPH_ARGS:-}"
      rc=$?
      ;;
    overlap)
      # The envs in two halves, one stepping while the other's actions are computed.
      variant overlap "${OVERLAP_ALGOS:-ppo,pqn}" "--env-overlap on ${OVERLAP_ARGS:-}"
      rc=$?
      ;;
    restart)
      python3 benchmarks/gpu_restart.py --device cuda --algo "${RESTART_ALGO:-ppo}" \
        2>&1 | tee "$RES/gpu-restart-$STAMP.log"
      rc=${PIPESTATUS[0]}
      tail -n 1 "$RES/gpu-restart-$STAMP.log" > "$RES/gpu-restart-$STAMP.json"
      ;;
    compile)
      # rlsup's side again with its networks compiled (CUDA graphs included): keep what wins.
      rc=0
      for mode in ${COMPILE_MODES:-reduce-overhead default}; do
        variant "compile-$mode" "${COMPILE_ALGOS:-ppo,pqn}" "--compile $mode"
        mode_rc=$?
        [ "$rc" -eq 0 ] && rc=$mode_rc
      done
      ;;
    precision)
      # fp32 with TF32 against the default (bf16 autocast) at these batch sizes: keep the faster.
      variant fp32 "${PRECISION_ALGOS:-ppo,dqn,pqn}" "--precision fp32"
      rc=$?
      ;;
    learn)
      python3 benchmarks/learning.py --device cuda --algos "${LEARN_ALGOS:-ppo,pqn}" \
        --seeds "${LEARN_SEEDS:-1}" --steps "${LEARN_STEPS:-500000}" --threads 4 --parallel 1 \
        --ledger "$RES/learning-cuda-$STAMP.jsonl" 2>&1 | tee "$RES/learning-cuda-$STAMP.log"
      rc=${PIPESTATUS[0]}
      ;;
    *)
      echo "unknown stage $stage (tests, peers, graphs, overlap, restart, compile, precision, learn)" >&2
      rc=2
      ;;
  esac
  echo "== $stage: exit $rc ($(date -u +%T))"
  [ "$status" -eq 0 ] && status=$rc
done
if [ -n "${OUT:-}" ] && [ "$OUT" != "$RES" ]; then
  tar czf "$OUT/gpu-session-$STAMP.tgz" -C "$RES" . && echo "packed into $OUT/gpu-session-$STAMP.tgz"
fi
for f in "$RES"/*.json; do [ -s "$f" ] && { echo "== $f"; cat "$f"; }; done
exit "$status"
