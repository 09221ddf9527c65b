#!/usr/bin/env bash
# redis.sh start|stop|status: a throwaway redis-server (no persistence) on 127.0.0.1:$REDIS_PORT
# (default 6379), pid and log in $REDIS_DIR (default .local/redis). Installs Debian's
# redis-server when missing. "start" reuses a server that already answers PING on the port.
set -euo pipefail
source "$(dirname "$0")/common.sh"

PORT="${REDIS_PORT:-6379}"
DIR="${REDIS_DIR:-$LOCAL_DIR/redis}"
mkdir -p "$DIR" && DIR="$(cd "$DIR" && pwd)"
PIDFILE="$DIR/redis-$PORT.pid" LOGFILE="$DIR/redis-$PORT.log"

pong() { [[ $(redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null) == PONG ]]; }

start() {
  ensure_redis_installed
  exec 9>"$DIR/lock" && flock 9
  if pong; then log "already answering on 127.0.0.1:$PORT"; return 0; fi
  port_open 127.0.0.1 "$PORT" && die "port $PORT is taken by something that does not answer Redis PING"
  # --daemonize closes the caller's stdio; 9>&- releases the lock for the daemon.
  redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
    --dir "$DIR" --pidfile "$PIDFILE" --logfile "$LOGFILE" 9>&-
  for ((i = 0; i < 100; i++)); do pong && { log "answering on 127.0.0.1:$PORT"; return 0; }; sleep 0.1; done
  tail -n 20 "$LOGFILE" >&2 || true
  die "redis-server did not answer PING on 127.0.0.1:$PORT within 10s"
}

case "${1:-}" in
  start) start ;;
  stop) stop_pid "$PIDFILE" ;;
  status) if pong; then log "answering on 127.0.0.1:$PORT"; else log "not answering on 127.0.0.1:$PORT"; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
