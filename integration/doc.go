// Package integration holds Gatekeeper's end-to-end tests, which run against a real
// Apache Kafka broker and a real Redis.
//
// TestMain resolves the servers once per run, in this order:
//
//  1. GATEKEEPER_TEST_KAFKA and GATEKEEPER_TEST_REDIS (host:port), when set;
//  2. containers started by testcontainers-go, when a Docker engine is reachable;
//  3. otherwise the scripts in deploy/local, which start (or reuse) a local
//     KRaft broker from the Maven jars and a local redis-server.
//
// Redis Cluster tests read GATEKEEPER_TEST_REDIS_CLUSTER (comma-separated
// host:port) or start deploy/local/redis-cluster.sh on first use.
// Every test gets its own topics (newTopic) and Redis key prefix (keyPrefix), so
// tests may run in parallel and against servers that outlive the run.
// With -short the package is skipped.
package integration
