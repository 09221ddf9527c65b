# Gatekeeper developer targets. `make test` needs only Go, Java 17+ and Maven: it starts
# (or reuses) a local Kafka, redis-server and Redis Cluster for every GATEKEEPER_TEST_*
# address that is not already set, and leaves them running for the next run
# (`make servers-down` stops them). The tests of deploy/ run promtool on the alert rules and
# the dashboard through deploy/local/promtool.sh, which installs Debian's prometheus
# package with apt-get when promtool is missing (redis-server comes the same way).

GO        ?= go
# `make test` runs everything against Kafka KAFKA_VERSION on KAFKA_PORT, then the packages
# that talk to Kafka (KAFKA_PKGS) and the fault suite against KAFKA_VERSION_2 on KAFKA_PORT_2.
# Each release keeps its own state in .local/kafka-<version> (deploy/local/kafka.sh); the
# second pass reuses the first pass's Redis servers. `make bench` uses KAFKA_VERSION, whose
# default is also KAFKA_DEFAULT_VERSION in deploy/local/common.sh (the scripts' own default).
KAFKA_VERSION   ?= 4.4.0
KAFKA_PORT      ?= 9092
KAFKA_VERSION_2 ?= 3.9.1
KAFKA_PORT_2    ?= 9192
# Empty: kafka.sh's defaults (.local/kafka-$(KAFKA_VERSION_2), controller on KAFKA_PORT_2+1).
KAFKA_DIR_2             ?=
KAFKA_CONTROLLER_PORT_2 ?=
# A broker of KAFKA_VERSION_2 to use instead of starting one (what GATEKEEPER_TEST_KAFKA is to the first pass).
GATEKEEPER_TEST_KAFKA_2 ?=
KAFKA_PKGS ?= ./integration/... ./internal/consume/ ./internal/route/
# The fault suite (build tag fault) starts a private broker of GATEKEEPER_TEST_KAFKA_VERSION
# and a private redis-server; -v prints its figures.
FAULT_PKG  ?= ./integration/fault/
FAULT_TEST  = $(GO) test -race -count=1 -tags fault -v -timeout 30m $(FAULT_PKG)
LOCAL_DIR  := $(or $(GATEKEEPER_LOCAL_DIR),.local)
WITH_SERVERS   := deploy/local/test-env.sh
WITH_SERVERS_1 := KAFKA_VERSION=$(KAFKA_VERSION) KAFKA_PORT=$(KAFKA_PORT) $(WITH_SERVERS)
WITH_SERVERS_2 := KAFKA_VERSION=$(KAFKA_VERSION_2) KAFKA_PORT=$(KAFKA_PORT_2) KAFKA_DIR=$(KAFKA_DIR_2) \
  KAFKA_CONTROLLER_PORT=$(KAFKA_CONTROLLER_PORT_2) GATEKEEPER_TEST_KAFKA=$(GATEKEEPER_TEST_KAFKA_2) \
  GATEKEEPER_TEST_KAFKA_VERSION=$(KAFKA_VERSION_2) $(WITH_SERVERS)
# step VERSION,WHAT,COMMAND: runs COMMAND under a header line naming the Kafka release, and
# names the step again when it fails (no commas in WHAT).
define step
	@echo "== Kafka $(1): $(2)"
	$(3) || { echo "== FAILED: Kafka $(1): $(2)"; exit 1; }
endef
# Packages and duration of the micro-benchmarks of `make bench`; add packages here as benchmarks appear.
BENCH_PKGS ?= ./internal/limit/
BENCHTIME  ?= 2s
BENCHFLAGS ?= -benchmem
# The end-to-end benchmark of `make bench` (integration/bench): the data set, the
# sweep, and a Redis of its own on BENCH_REDIS_PORT (its command stats are reset per
# mode, so other clients must not share it). BENCH_ARGS passes more flags
# (go run ./integration/bench -help lists them).
BENCH_EVENTS        ?= 1000000
BENCH_TENANTS       ?= 10000
BENCH_EVENT_SIZE    ?= 200
BENCH_PARTITIONS    ?= 6
BENCH_BATCH         ?= 500
# The main scenario runs every mode BENCH_ROUNDS times, interleaved; each is
# reported by its median round (the machine's other load moves single runs).
BENCH_ROUNDS        ?= 3
BENCH_SWEEP_EVENTS  ?= 200000
BENCH_SWEEP_TENANTS ?= 100,10000,1000000
BENCH_SWEEP_BATCHES ?= 100,500,2000
BENCH_REDIS_PORT    ?= 6395
BENCH_OUT           ?= bench-results
BENCH_ARGS          ?=
# Duration of each fuzz target in `make fuzz`.
FUZZTIME   ?= 20s

.PHONY: all build check test vet bench demo fuzz servers-up servers-down servers-status

all: build

build:
	$(GO) build -o bin/gatekeeper ./cmd/gatekeeper

vet:
	$(GO) vet ./...
	$(GO) vet -tags fault $(FAULT_PKG)

# The quick check of the edit-compile-test loop: vet, then every package's tests with -short
# and the GATEKEEPER_TEST_* servers unset, so that the tests that need Kafka or Redis skip
# (testenv skips them under -short; integration skips whole) and nothing is started.
# Under three minutes on two cores; `make test` stays the whole suite (and what CI runs).
CHECK_ENV := env -u GATEKEEPER_LOCAL_DIR -u GATEKEEPER_TEST_KAFKA -u GATEKEEPER_TEST_REDIS -u GATEKEEPER_TEST_REDIS_CLUSTER
# Examples cannot skip, and internal/limit's need Redis: -run leaves them to `make test`.
check: vet
	$(CHECK_ENV) $(GO) test -short -race -count=1 -timeout 10m -run '^(Test|Fuzz)' ./...

# vet first: it needs no servers, so a compile error fails before Kafka starts.
test: vet
	$(call step,$(KAFKA_VERSION),unit and integration tests (go test ./...),$(WITH_SERVERS_1) $(GO) test -race -count=1 -timeout 40m ./...)
	$(call step,$(KAFKA_VERSION),fault suite ($(FAULT_PKG)),GATEKEEPER_TEST_KAFKA_VERSION=$(KAFKA_VERSION) $(FAULT_TEST))
	$(call step,$(KAFKA_VERSION_2),the packages that use Kafka ($(KAFKA_PKGS)),$(WITH_SERVERS_2) $(GO) test -race -count=1 -timeout 40m $(KAFKA_PKGS))
	$(call step,$(KAFKA_VERSION_2),fault suite ($(FAULT_PKG)),GATEKEEPER_TEST_KAFKA_VERSION=$(KAFKA_VERSION_2) $(FAULT_TEST))
	@echo "== make test: passed against Kafka $(KAFKA_VERSION) and Kafka $(KAFKA_VERSION_2)"

# Micro-benchmarks first (the limiter's BenchmarkAdmit), then the end-to-end run.
bench: build
	$(WITH_SERVERS_1) $(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) $(BENCHFLAGS) $(BENCH_PKGS)
	REDIS_PORT=$(BENCH_REDIS_PORT) deploy/local/redis.sh start
	GATEKEEPER_BENCH_REDIS=127.0.0.1:$(BENCH_REDIS_PORT) $(WITH_SERVERS_1) $(GO) run ./integration/bench \
	  -kafka-pid-file $(or $(KAFKA_DIR),$(LOCAL_DIR)/kafka-$(KAFKA_VERSION))/kafka.pid \
	  -events $(BENCH_EVENTS) -tenants $(BENCH_TENANTS) -event-size $(BENCH_EVENT_SIZE) \
	  -partitions $(BENCH_PARTITIONS) -batch $(BENCH_BATCH) -rounds $(BENCH_ROUNDS) -sweep-events $(BENCH_SWEEP_EVENTS) \
	  -sweep-tenants $(BENCH_SWEEP_TENANTS) -sweep-batches $(BENCH_SWEEP_BATCHES) \
	  -gatekeeper-bin bin/gatekeeper -out $(BENCH_OUT) $(BENCH_ARGS)

demo:
	$(GO) run ./cmd/gatekeeper-demo

# Runs every FuzzXxx target in the module for FUZZTIME each (go test -fuzz takes one target at a time).
fuzz:
	@set -e; found=; \
	for f in $$(grep -rl --include='*_test.go' --exclude-dir=.local '^func Fuzz' .); do \
	  for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
	    found=1; echo "fuzz $$(dirname $$f) $$t"; \
	    $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$(dirname $$f); \
	  done; \
	done; [ -n "$$found" ] || echo "no fuzz targets yet"

KAFKA_1 := KAFKA_VERSION=$(KAFKA_VERSION) KAFKA_PORT=$(KAFKA_PORT) deploy/local/kafka.sh
KAFKA_2 := KAFKA_VERSION=$(KAFKA_VERSION_2) KAFKA_PORT=$(KAFKA_PORT_2) KAFKA_DIR=$(KAFKA_DIR_2) \
  KAFKA_CONTROLLER_PORT=$(KAFKA_CONTROLLER_PORT_2) deploy/local/kafka.sh

servers-up:
	$(KAFKA_1) start
	deploy/local/redis.sh start
	deploy/local/redis-cluster.sh start

# Also stops a broker left in .local/kafka by the scripts before they took KAFKA_VERSION (Kafka 3.9.1).
servers-down:
	$(KAFKA_1) stop
	$(KAFKA_2) stop
	if [ -s $(LOCAL_DIR)/kafka/kafka.pid ]; then KAFKA_DIR=$(LOCAL_DIR)/kafka deploy/local/kafka.sh stop; fi
	deploy/local/redis.sh stop
	REDIS_PORT=$(BENCH_REDIS_PORT) deploy/local/redis.sh stop
	deploy/local/redis-cluster.sh stop

servers-status:
	-$(KAFKA_1) status
	-$(KAFKA_2) status
	-deploy/local/redis.sh status
	-deploy/local/redis-cluster.sh status
