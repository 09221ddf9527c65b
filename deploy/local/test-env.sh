#!/usr/bin/env bash
# test-env.sh CMD [ARGS...]: runs CMD with the test servers exported. Each of
# GATEKEEPER_TEST_KAFKA, GATEKEEPER_TEST_REDIS and GATEKEEPER_TEST_REDIS_CLUSTER that is
# unset is pointed at a local server started (or reused) by the scripts next to this one;
# one that is set is used as given and nothing is started for it.
# GATEKEEPER_TEST_KAFKA_VERSION is exported too, for tests that start a private broker
# (integration/fault): the release kafka.sh started (KAFKA_VERSION, else
# GATEKEEPER_TEST_KAFKA_VERSION, else kafka.sh's default), or, when GATEKEEPER_TEST_KAFKA
# is given, GATEKEEPER_TEST_KAFKA_VERSION (else KAFKA_VERSION, else that default) as given.
set -euo pipefail
source "$(dirname "$0")/common.sh"
here="$(cd "$(dirname "$0")" && pwd)"

if [[ -z ${GATEKEEPER_TEST_KAFKA:-} ]]; then
  export KAFKA_VERSION="${KAFKA_VERSION:-${GATEKEEPER_TEST_KAFKA_VERSION:-$KAFKA_DEFAULT_VERSION}}"
  "$here/kafka.sh" start
  export GATEKEEPER_TEST_KAFKA="127.0.0.1:${KAFKA_PORT:-9092}"
  export GATEKEEPER_TEST_KAFKA_VERSION="$KAFKA_VERSION"
else
  export GATEKEEPER_TEST_KAFKA_VERSION="${GATEKEEPER_TEST_KAFKA_VERSION:-${KAFKA_VERSION:-$KAFKA_DEFAULT_VERSION}}"
fi
if [[ -z ${GATEKEEPER_TEST_REDIS:-} ]]; then
  "$here/redis.sh" start
  export GATEKEEPER_TEST_REDIS="127.0.0.1:${REDIS_PORT:-6379}"
fi
if [[ -z ${GATEKEEPER_TEST_REDIS_CLUSTER:-} ]]; then
  "$here/redis-cluster.sh" start
  read -r -a ports <<<"${REDIS_CLUSTER_PORTS:-7001 7002 7003}"
  GATEKEEPER_TEST_REDIS_CLUSTER="$(printf '127.0.0.1:%s,' "${ports[@]}")"
  export GATEKEEPER_TEST_REDIS_CLUSTER="${GATEKEEPER_TEST_REDIS_CLUSTER%,}"
fi
echo "test servers: kafka=$GATEKEEPER_TEST_KAFKA (Kafka $GATEKEEPER_TEST_KAFKA_VERSION) redis=$GATEKEEPER_TEST_REDIS" \
  "redis-cluster=$GATEKEEPER_TEST_REDIS_CLUSTER" >&2
exec "$@"
