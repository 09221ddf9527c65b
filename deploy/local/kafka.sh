#!/usr/bin/env bash
# kafka.sh start|stop|status: a one-node Apache Kafka 3.9 (KRaft, broker+controller) on
# 127.0.0.1:$KAFKA_PORT (default 9092; controller on $KAFKA_CONTROLLER_PORT, default port+1),
# run from the jars Maven fetches. State (config, data, pid, log) lives in $KAFKA_DIR,
# default .local/kafka. "start" reuses a broker that already serves on the port.
set -euo pipefail
source "$(dirname "$0")/common.sh"

PORT="${KAFKA_PORT:-9092}"
CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-$((PORT + 1))}"
DIR="${KAFKA_DIR:-$LOCAL_DIR/kafka}"
mkdir -p "$DIR" && DIR="$(cd "$DIR" && pwd)" # absolute: it goes into log.dirs
ADDR="127.0.0.1:$PORT"
TIMEOUT="${KAFKA_START_TIMEOUT:-90}"
PIDFILE="$DIR/kafka.pid" LOGFILE="$DIR/kafka.log"

# classpath: resolve (and on first use download) the jars, cached in $DIR/classpath.
classpath() {
  local cp="$DIR/classpath"
  if [[ ! -s $cp ]] || ! [[ -f $(cut -d: -f1 "$cp") ]]; then
    log "resolving Kafka jars with Maven (downloads them on first use)"
    local t0=$SECONDS
    if ! mvn -B dependency:build-classpath -f "$ROOT/deploy/local/kafka-pom.xml" \
      -Dmdep.outputFile="$cp.tmp" >"$DIR/maven.log" 2>&1; then
      tail -n 30 "$DIR/maven.log" >&2
      die "Maven could not fetch the Kafka jars (full output: $DIR/maven.log)"
    fi
    mv "$cp.tmp" "$cp"
    log "jars resolved in $((SECONDS - t0))s"
  fi
  cat "$cp"
}

# serving: true when the broker answers a real request (metadata + ApiVersions), not just a TCP accept.
serving() {
  port_open 127.0.0.1 "$PORT" || return 1
  [[ -f $DIR/log4j-tools.properties ]] || write_log4j
  timeout 30 java -Xmx128m -Dlog4j.configuration="file:$DIR/log4j-tools.properties" -cp "$(classpath)" \
    kafka.admin.BrokerApiVersionsCommand --bootstrap-server "$ADDR" >/dev/null 2>&1
}

write_config() {
  mkdir -p "$DIR/data"
  cat >"$DIR/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
controller.listener.names=CONTROLLER
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$DIR/data
num.partitions=6
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
# Tests create their topics explicitly; a typo must fail, not create a topic.
auto.create.topics.enable=false
PROPS
  write_log4j
}

write_log4j() {
  # Broker log: INFO to stdout, which start() redirects to kafka.log.
  printf '%s\n' 'log4j.rootLogger=INFO, out' 'log4j.appender.out=org.apache.log4j.ConsoleAppender' \
    'log4j.appender.out.layout=org.apache.log4j.PatternLayout' \
    'log4j.appender.out.layout.ConversionPattern=[%d] %p %m (%c)%n' >"$DIR/log4j.properties"
  # Command-line tools: errors only.
  printf '%s\n' 'log4j.rootLogger=ERROR, err' 'log4j.appender.err=org.apache.log4j.ConsoleAppender' \
    'log4j.appender.err.Target=System.err' 'log4j.appender.err.layout=org.apache.log4j.PatternLayout' \
    'log4j.appender.err.layout.ConversionPattern=%p %m%n' >"$DIR/log4j-tools.properties"
}

start() {
  exec 9>"$DIR/lock" && flock 9 # one start at a time (fd 9 is closed for the broker below)
  write_config
  if serving; then log "already serving on $ADDR"; return 0; fi
  local cp t0
  cp="$(classpath)"
  t0=$SECONDS
  if ! pid_alive "$PIDFILE"; then
    if port_open 127.0.0.1 "$PORT"; then die "port $PORT is taken by something that is not a Kafka broker"; fi
    if [[ ! -f $DIR/data/meta.properties ]]; then # format the storage once
      local id
      id=$(java -Dlog4j.configuration="file:$DIR/log4j-tools.properties" -cp "$cp" kafka.tools.StorageTool random-uuid)
      java -Dlog4j.configuration="file:$DIR/log4j-tools.properties" -cp "$cp" kafka.tools.StorageTool \
        format -t "$id" -c "$DIR/server.properties" >&2
    fi
    log "starting Kafka on $ADDR (log: $LOGFILE)"
    # setsid + all fds redirected: the broker outlives this script and holds no caller's pipe open.
    setsid java -Xms256m -Xmx768m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
      -Djava.awt.headless=true -Dlog4j.configuration="file:$DIR/log4j.properties" \
      -cp "$cp" kafka.Kafka "$DIR/server.properties" >"$LOGFILE" 2>&1 </dev/null 9>&- &
    echo $! >"$PIDFILE"
  else
    log "Kafka pid $(cat "$PIDFILE") is running but not serving yet: waiting for it"
  fi
  until serving; do
    if ! pid_alive "$PIDFILE"; then
      tail -n 30 "$LOGFILE" >&2 || true
      die "Kafka exited during start-up (last log lines above)"
    fi
    if ((SECONDS - t0 > TIMEOUT)); then
      tail -n 30 "$LOGFILE" >&2 || true
      die "Kafka did not serve on $ADDR within ${TIMEOUT}s (last log lines above; pid $(cat "$PIDFILE") left running)"
    fi
    sleep 1
  done
  log "serving on $ADDR after $((SECONDS - t0))s"
}

case "${1:-}" in
  start) start ;;
  stop) stop_pid "$PIDFILE" ;;
  status)
    if serving; then log "serving on $ADDR"; else log "not serving on $ADDR"; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
