#!/usr/bin/env bash
# redis-cluster.sh start|stop|status: a throwaway three-master Redis Cluster (no replicas, no
# persistence) on 127.0.0.1:$REDIS_CLUSTER_PORTS (default "7001 7002 7003"; each also uses
# port+10000 for the cluster bus), one dir per node in $REDIS_CLUSTER_DIR (default
# .local/redis-cluster). "start" reuses a cluster whose nodes all report cluster_state:ok.
set -euo pipefail
source "$(dirname "$0")/common.sh"

read -r -a PORTS <<<"${REDIS_CLUSTER_PORTS:-7001 7002 7003}"
DIR="${REDIS_CLUSTER_DIR:-$LOCAL_DIR/redis-cluster}"
mkdir -p "$DIR" && DIR="$(cd "$DIR" && pwd)"

cli() { local port=$1; shift; redis-cli -h 127.0.0.1 -p "$port" "$@" 2>/dev/null; }
# all_ok: every node answers and sees the whole cluster as ok.
all_ok() {
  local p
  for p in "${PORTS[@]}"; do cli "$p" cluster info | grep -q '^cluster_state:ok' || return 1; done
}

start() {
  ensure_redis_installed
  exec 9>"$DIR/lock" && flock 9
  if all_ok; then log "cluster already ok on ports ${PORTS[*]}"; return 0; fi
  local p i addrs=()
  for p in "${PORTS[@]}"; do
    addrs+=("127.0.0.1:$p")
    [[ $(cli "$p" ping) == PONG ]] && continue
    port_open 127.0.0.1 "$p" && die "port $p is taken by something that does not answer Redis PING"
    mkdir -p "$DIR/$p" && rm -f "$DIR/$p/nodes.conf" # a fresh node each start: data is throwaway
    redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file nodes.conf \
      --cluster-node-timeout 5000 --save '' --appendonly no --daemonize yes --dir "$DIR/$p" \
      --pidfile "$DIR/$p/redis.pid" --logfile "$DIR/$p/redis.log" 9>&-
  done
  for p in "${PORTS[@]}"; do # wait for every node, then wipe any old cluster state
    for ((i = 0; i < 100; i++)); do [[ $(cli "$p" ping) == PONG ]] && break; sleep 0.1; done
    [[ $(cli "$p" ping) == PONG ]] || die "node 127.0.0.1:$p did not answer PING (log: $DIR/$p/redis.log)"
    cli "$p" flushall >/dev/null && cli "$p" cluster reset hard >/dev/null
  done
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >"$DIR/create.log" 2>&1 ||
    { cat "$DIR/create.log" >&2; die "redis-cli --cluster create failed"; }
  for ((i = 0; i < 300; i++)); do all_ok && { log "cluster ok on ports ${PORTS[*]}"; return 0; }; sleep 0.1; done
  die "cluster did not reach cluster_state:ok within 30s (logs: $DIR/*/redis.log)"
}

stop() {
  local p
  for p in "${PORTS[@]}"; do stop_pid "$DIR/$p/redis.pid"; done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) if all_ok; then log "cluster ok on ports ${PORTS[*]}"; else log "cluster not ok on ports ${PORTS[*]}"; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
