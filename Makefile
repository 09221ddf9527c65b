# Gatekeeper developer targets. `make test` needs only Go, Java 17+ and Maven: it starts
# (or reuses) a local Kafka, redis-server and Redis Cluster for every GATEKEEPER_TEST_*
# address that is not already set, and leaves them running for the next run
# (`make servers-down` stops them).

GO        ?= go
WITH_SERVERS := deploy/local/test-env.sh
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

.PHONY: all build test vet bench demo fuzz servers-up servers-down servers-status

all: build

build:
	$(GO) build -o bin/gatekeeper ./cmd/gatekeeper

vet:
	$(GO) vet ./...

# vet first: it needs no servers, so a compile error fails before Kafka starts.
test: vet
	$(WITH_SERVERS) $(GO) test -race -count=1 -timeout 40m ./...

# Micro-benchmarks first (the limiter's BenchmarkAdmit), then the end-to-end run.
bench: build
	$(WITH_SERVERS) $(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) $(BENCHFLAGS) $(BENCH_PKGS)
	REDIS_PORT=$(BENCH_REDIS_PORT) deploy/local/redis.sh start
	GATEKEEPER_BENCH_REDIS=127.0.0.1:$(BENCH_REDIS_PORT) $(WITH_SERVERS) $(GO) run ./integration/bench \
	  -events $(BENCH_EVENTS) -tenants $(BENCH_TENANTS) -event-size $(BENCH_EVENT_SIZE) \
	  -partitions $(BENCH_PARTITIONS) -batch $(BENCH_BATCH) -rounds $(BENCH_ROUNDS) -sweep-events $(BENCH_SWEEP_EVENTS) \
	  -sweep-tenants $(BENCH_SWEEP_TENANTS) -sweep-batches $(BENCH_SWEEP_BATCHES) \
	  -gatekeeper-bin bin/gatekeeper -out $(BENCH_OUT) $(BENCH_ARGS)

demo:
	$(GO) run ./cmd/gatekeeper demo

# Runs every FuzzXxx target in the module for FUZZTIME each (go test -fuzz takes one target at a time).
fuzz:
	@set -e; found=; \
	for f in $$(grep -rl --include='*_test.go' --exclude-dir=.local '^func Fuzz' .); do \
	  for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
	    found=1; echo "fuzz $$(dirname $$f) $$t"; \
	    $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$(dirname $$f); \
	  done; \
	done; [ -n "$$found" ] || echo "no fuzz targets yet"

servers-up:
	deploy/local/kafka.sh start
	deploy/local/redis.sh start
	deploy/local/redis-cluster.sh start

servers-down:
	deploy/local/kafka.sh stop
	deploy/local/redis.sh stop
	REDIS_PORT=$(BENCH_REDIS_PORT) deploy/local/redis.sh stop
	deploy/local/redis-cluster.sh stop

servers-status:
	-deploy/local/kafka.sh status
	-deploy/local/redis.sh status
	-deploy/local/redis-cluster.sh status
