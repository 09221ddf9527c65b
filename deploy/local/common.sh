# common.sh: helpers sourced by the deploy/local scripts. Not executable on its own.
# Every script keeps its state (config, data, pid, log) under $GATEKEEPER_LOCAL_DIR,
# default <repo>/.local, which is gitignored.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
LOCAL_DIR="${GATEKEEPER_LOCAL_DIR:-$ROOT/.local}"

# The Kafka release kafka.sh and test-env.sh use when KAFKA_VERSION is unset (keep the
# Makefile's KAFKA_VERSION default the same).
KAFKA_DEFAULT_VERSION=4.4.0

log() { echo "[$(basename "$0" .sh)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# port_open HOST PORT: true when something accepts TCP connections there.
port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# pid_alive FILE: true when FILE names a running process.
pid_alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# stop_pid FILE: TERM the process in FILE, wait up to 30s, then KILL it.
stop_pid() {
  local file=$1 pid i
  if ! pid_alive "$file"; then log "not running (no live pid in $file)"; rm -f "$file"; return 0; fi
  pid=$(cat "$file")
  kill "$pid"
  for ((i = 0; i < 300; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then log "pid $pid ignored TERM for 30s, killing"; kill -9 "$pid"; fi
  rm -f "$file"
  log "stopped (pid $pid)"
}

# ensure_redis_installed: installs Debian's redis-server (and redis-cli) when missing.
ensure_redis_installed() {
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null && return 0
  local sudo=""
  [[ $(id -u) -eq 0 ]] || sudo=sudo
  log "redis-server not found: installing it with apt-get"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >&2
}

# ensure_promtool_installed: installs Debian's prometheus package, which holds promtool, when
# promtool is missing. Only promtool is wanted: the Prometheus server the package brings is
# stopped and disabled again if the package's scripts started it (a policy-rc.d that forbids
# starting services, as in containers, keeps it from starting in the first place). Safe to
# call concurrently: callers take a lock shared by every checkout on the machine, the second
# finds promtool installed, and apt waits for a dpkg lock held by someone else.
ensure_promtool_installed() {
  command -v promtool >/dev/null && return 0
  local sudo="" lock="${TMPDIR:-/tmp}/gatekeeper-promtool-install.lock"
  [[ $(id -u) -eq 0 ]] || sudo=sudo
  exec 8>"$lock" && flock 8
  if command -v promtool >/dev/null; then exec 8>&-; return 0; fi
  log "promtool not found: installing Debian's prometheus package with apt-get"
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -qq)
  $sudo "${apt[@]}" update
  $sudo "${apt[@]}" install -y --no-install-recommends prometheus >&2
  if [[ -d /run/systemd/system ]]; then
    $sudo systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  elif [[ -x /etc/init.d/prometheus ]]; then
    $sudo /etc/init.d/prometheus stop >/dev/null 2>&1 || true
  fi
  exec 8>&-
  command -v promtool >/dev/null || die "apt-get installed prometheus but promtool is not on PATH"
}
