#!/usr/bin/env bash
# kafka.sh start|stop|status: a one-node Apache Kafka (KRaft, broker+controller) on
# 127.0.0.1:$KAFKA_PORT (default 9092; controller on $KAFKA_CONTROLLER_PORT, default port+1),
# run from the jars Maven fetches. The release is $KAFKA_VERSION (else
# $GATEKEEPER_TEST_KAFKA_VERSION, else 4.4.0); any 3.x or 4.x on Maven Central, 4.4.0 and
# 3.9.1 being the two `make test` runs. State (config, data, pid, log, classpath) lives in
# $KAFKA_DIR, default .local/kafka-<version>, so releases never share storage; kafka.log is
# the broker's log since its last start (kafka.log.1 the run before).
# "start" reuses a broker of the same release that already serves on the port, refuses one
# of another release, and keeps the data of an earlier start in the same $KAFKA_DIR (stop
# then start is a restart, not a fresh broker).
# Two hooks for a private broker of a test (integration/sasl_tls_test.go): $KAFKA_EXTRA_CONFIG
# names a file of broker properties appended to server.properties on every start (a later line
# overrides an earlier one, so it may replace the listeners), and $KAFKA_FORMAT_ARGS holds more
# arguments of the storage format of the first start, split on spaces (e.g. --add-scram
# SCRAM-SHA-512=[name=u,password=p], users created before the broker starts).
set -euo pipefail
source "$(dirname "$0")/common.sh"

VERSION="${KAFKA_VERSION:-${GATEKEEPER_TEST_KAFKA_VERSION:-$KAFKA_DEFAULT_VERSION}}"
[[ $VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "KAFKA_VERSION=$VERSION: want a release such as 4.4.0 or 3.9.1"
PORT="${KAFKA_PORT:-9092}"
CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-$((PORT + 1))}"
DIR="${KAFKA_DIR:-$LOCAL_DIR/kafka-$VERSION}"
mkdir -p "$DIR" && DIR="$(cd "$DIR" && pwd)" # absolute: it goes into log.dirs
ADDR="127.0.0.1:$PORT"
TIMEOUT="${KAFKA_START_TIMEOUT:-90}"
PIDFILE="$DIR/kafka.pid" LOGFILE="$DIR/kafka.log"

# What differs between the major releases: the Maven profile (logging backend), the logging
# configuration the JVM is pointed at, and where BrokerApiVersionsCommand lives.
case ${VERSION%%.*} in
  3) # reload4j (log4j 1.x API), as the 3.x distribution
    PROFILE=kafka3
    LOG_OPT="-Dlog4j.configuration=file:$DIR/log4j.properties"
    TOOLS_LOG_OPT="-Dlog4j.configuration=file:$DIR/log4j-tools.properties"
    TOOLS_LOG_FILE="$DIR/log4j-tools.properties"
    API_VERSIONS_TOOL=kafka.admin.BrokerApiVersionsCommand ;;
  4) # log4j2, as the 4.x distribution; the tool moved to the kafka-tools jar
    PROFILE=kafka4
    LOG_OPT="-Dlog4j2.configurationFile=$DIR/log4j2.properties"
    TOOLS_LOG_OPT="-Dlog4j2.configurationFile=$DIR/log4j2-tools.properties"
    TOOLS_LOG_FILE="$DIR/log4j2-tools.properties"
    API_VERSIONS_TOOL=org.apache.kafka.tools.BrokerApiVersionsCommand ;;
  *) die "KAFKA_VERSION=$VERSION: this script knows Kafka 3.x and 4.x only" ;;
esac

# classpath: resolve (and on first use download) the jars, cached in $DIR/classpath.
classpath() {
  local cp="$DIR/classpath"
  if [[ ! -s $cp ]] || ! [[ -f $(cut -d: -f1 "$cp") ]] || ! grep -q "/kafka_2\.13-$VERSION\.jar" "$cp"; then
    log "resolving the Kafka $VERSION jars with Maven (downloads them on first use)"
    local t0=$SECONDS
    if ! mvn -B dependency:build-classpath -f "$ROOT/deploy/local/kafka-pom.xml" \
      -Dkafka.version="$VERSION" -P"$PROFILE" -Dmdep.outputFile="$cp.tmp" >"$DIR/maven.log" 2>&1; then
      tail -n 30 "$DIR/maven.log" >&2
      die "Maven could not fetch the Kafka $VERSION jars (full output: $DIR/maven.log)"
    fi
    mv "$cp.tmp" "$cp"
    log "jars resolved in $((SECONDS - t0))s"
  fi
  cat "$cp"
}

# serving: true when the broker answers a real request (metadata + ApiVersions), not just a TCP accept.
serving() {
  port_open 127.0.0.1 "$PORT" || return 1
  [[ -f $TOOLS_LOG_FILE ]] || write_logging
  timeout 30 java -Xmx128m "$TOOLS_LOG_OPT" -cp "$(classpath)" \
    "$API_VERSIONS_TOOL" --bootstrap-server "$ADDR" >/dev/null 2>&1
}

# listener_pid: the pid of the process that listens on $PORT (empty when none is found).
listener_pid() {
  local hex inode f
  if command -v ss >/dev/null; then
    ss -Hltnp "sport = :$PORT" 2>/dev/null | grep -o 'pid=[0-9]*' | head -n 1 | cut -d= -f2
    return 0
  fi
  hex=$(printf '%04X' "$PORT") # no ss: find the listening socket's inode, then its owner
  inode=$(awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { print $10; exit }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null)
  [[ -n $inode ]] || return 0
  for f in /proc/[0-9]*/fd/*; do
    if [[ $(readlink "$f" 2>/dev/null) == "socket:[$inode]" ]]; then f=${f#/proc/}; echo "${f%%/*}"; return 0; fi
  done
}

# served_version: the release of the broker serving on $PORT, read from the kafka_2.13-X.jar
# on its command line (a local broker started from jars, by this script or a distribution);
# empty when it cannot be told (not a local process, or another layout).
served_version() {
  local pid
  pid=$(listener_pid)
  [[ -n $pid && -r /proc/$pid/cmdline ]] || return 0
  tr '\0' '\n' <"/proc/$pid/cmdline" | grep -o 'kafka_2\.1[0-9]-[0-9][0-9.]*[0-9]\.jar' | head -n 1 |
    sed 's/^kafka_2\.1[0-9]-//; s/\.jar$//' || true
}

# check_served_version: fails when the broker on $PORT is of another release than $VERSION.
check_served_version() {
  local running
  running=$(served_version)
  if [[ -z $running ]]; then
    log "a broker serves on $ADDR but its release could not be told; assuming it is Kafka $VERSION"
  elif [[ $running != "$VERSION" ]]; then
    die "$ADDR is served by Kafka $running (pid $(listener_pid)), not $VERSION: stop it" \
      "(make servers-down stops the brokers of these scripts) or use another KAFKA_PORT"
  fi
}

write_config() {
  mkdir -p "$DIR/data"
  cat >"$DIR/server.properties" <<PROPS
# Written by deploy/local/kafka.sh for Kafka $VERSION on every start.
process.roles=broker,controller
node.id=1
# A static quorum: both 3.x and 4.x accept it (4.x also offers a dynamic one,
# controller.quorum.bootstrap.servers + kafka-storage format --standalone).
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
  if [[ $PROFILE == kafka4 ]]; then # share groups (KIP-932) exist from 4.x; one node holds their state
    printf '%s\n' 'share.coordinator.state.topic.replication.factor=1' \
      'share.coordinator.state.topic.min.isr=1' >>"$DIR/server.properties"
  fi
  if [[ -n ${KAFKA_EXTRA_CONFIG:-} ]]; then
    { echo "# From KAFKA_EXTRA_CONFIG=$KAFKA_EXTRA_CONFIG"; cat "$KAFKA_EXTRA_CONFIG"; } >>"$DIR/server.properties"
  fi
  write_logging
}

write_logging() {
  if [[ $PROFILE == kafka3 ]]; then
    # Broker log: INFO to stdout, which start() redirects to kafka.log.
    printf '%s\n' 'log4j.rootLogger=INFO, out' 'log4j.appender.out=org.apache.log4j.ConsoleAppender' \
      'log4j.appender.out.layout=org.apache.log4j.PatternLayout' \
      'log4j.appender.out.layout.ConversionPattern=[%d] %p %m (%c)%n' >"$DIR/log4j.properties"
    # Command-line tools: errors only.
    printf '%s\n' 'log4j.rootLogger=ERROR, err' 'log4j.appender.err=org.apache.log4j.ConsoleAppender' \
      'log4j.appender.err.Target=System.err' 'log4j.appender.err.layout=org.apache.log4j.PatternLayout' \
      'log4j.appender.err.layout.ConversionPattern=%p %m%n' >"$DIR/log4j-tools.properties"
  else
    # The same two setups in log4j2's properties format. GroupCoordinatorShard is kept to WARN:
    # in 4.x it logs two lines per __consumer_offsets partition (50) for every deleted topic,
    # two thirds of the log of a test run that deletes its topics.
    printf '%s\n' 'status=warn' 'appender.out.type=Console' 'appender.out.name=out' \
      'appender.out.layout.type=PatternLayout' 'appender.out.layout.pattern=[%d] %p %m (%c)%n' \
      'rootLogger.level=info' 'rootLogger.appenderRef.out.ref=out' \
      'logger.shard.name=org.apache.kafka.coordinator.group.GroupCoordinatorShard' 'logger.shard.level=warn' \
      >"$DIR/log4j2.properties"
    printf '%s\n' 'status=warn' 'appender.err.type=Console' 'appender.err.name=err' 'appender.err.target=SYSTEM_ERR' \
      'appender.err.layout.type=PatternLayout' 'appender.err.layout.pattern=%p %m%n' \
      'rootLogger.level=error' 'rootLogger.appenderRef.err.ref=err' >"$DIR/log4j2-tools.properties"
  fi
}

start() {
  exec 9>"$DIR/lock" && flock 9 # one start at a time (fd 9 is closed for the broker below)
  # A data dir formatted by one release is not started by another (4.x storage cannot go back
  # to 3.x, and a silent upgrade is not what a test of 3.x wants).
  if [[ -f $DIR/data/meta.properties && -s $DIR/kafka-version && $(cat "$DIR/kafka-version") != "$VERSION" ]]; then
    die "$DIR holds the data of Kafka $(cat "$DIR/kafka-version"), not $VERSION: use another KAFKA_DIR"
  fi
  write_config
  if serving; then check_served_version; log "Kafka $VERSION already serving on $ADDR"; return 0; fi
  local cp t0
  cp="$(classpath)"
  t0=$SECONDS
  if ! pid_alive "$PIDFILE"; then
    if port_open 127.0.0.1 "$PORT"; then die "port $PORT is taken by something that is not a Kafka broker"; fi
    if [[ ! -f $DIR/data/meta.properties ]]; then # format the storage once
      local id format_args
      read -r -a format_args <<<"${KAFKA_FORMAT_ARGS:-}"
      id=$(java "$TOOLS_LOG_OPT" -cp "$cp" kafka.tools.StorageTool random-uuid)
      java "$TOOLS_LOG_OPT" -cp "$cp" kafka.tools.StorageTool format -t "$id" -c "$DIR/server.properties" \
        "${format_args[@]}" >&2
      echo "$VERSION" >"$DIR/kafka-version"
    fi
    log "starting Kafka $VERSION on $ADDR (log: $LOGFILE)"
    if [[ -s $LOGFILE ]]; then mv -f "$LOGFILE" "$LOGFILE.1"; fi # a restart keeps the previous run's log
    # setsid + all fds redirected: the broker outlives this script and holds no caller's pipe open.
    setsid java -Xms256m -Xmx768m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
      -Djava.awt.headless=true "$LOG_OPT" \
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
  log "Kafka $VERSION serving on $ADDR after $((SECONDS - t0))s"
}

case "${1:-}" in
  start) start ;;
  stop) stop_pid "$PIDFILE" ;;
  status)
    if serving; then
      log "serving on $ADDR: Kafka $(served_version | grep . || echo "of unknown release") (wanted: $VERSION; dir $DIR)"
    else
      log "not serving on $ADDR (Kafka $VERSION, dir $DIR)"; exit 1
    fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
