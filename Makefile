# Gatekeeper developer targets. `make test` needs only Go, Java 17+ and Maven: it starts
# (or reuses) a local Kafka, redis-server and Redis Cluster for every GATEKEEPER_TEST_*
# address that is not already set, and leaves them running for the next run
# (`make servers-down` stops them).

GO        ?= go
WITH_SERVERS := deploy/local/test-env.sh
# Packages and duration for `make bench`; add packages here as benchmarks appear.
BENCH_PKGS ?= ./internal/limit/
BENCHTIME  ?= 2s
BENCHFLAGS ?= -benchmem
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

bench:
	$(WITH_SERVERS) $(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) $(BENCHFLAGS) $(BENCH_PKGS)

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
	deploy/local/redis-cluster.sh stop

servers-status:
	-deploy/local/kafka.sh status
	-deploy/local/redis.sh status
	-deploy/local/redis-cluster.sh status
