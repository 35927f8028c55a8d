# heft — see README.md. `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
# A test binary may run longer than go test's default 10 min on a busy machine:
# packaging (lintian, rpmlint) took over 10 min at a load of 25 on 2 cores.
TEST_TIMEOUT ?= 30m
BIN := bin
# go test starts packages in the order it is given them: the slowest
# (mostly waiting on real processes) go first, so that they do not start
# last and run alone at the end (reliability started at 670 s of an 838 s
# .ci/run).
SLOW_FIRST := ./reliability/ ./bench/ ./e2e/ ./packaging/ ./coordinator/web/ ./coordinator/server/
# Packages run at once. go test's default is one per core, but the slow
# packages spend much of their time waiting (bench's TestRoutingShort on
# load arrivals, reliability on real timeouts): on 2 cores, one per core
# left 27 % of the CPU idle (485 s wall for 708 s of CPU), three at once
# took 340 s for 580 s (go test -json with /usr/bin/time, one run each).
TEST_PARALLEL ?= 3
# The version lives in VERSION; binaries report it with the commit as semver
# build metadata (0.2.0+<commit>, -dirty for uncommitted changes).
BUILD_VERSION := $(shell ./scripts/version.sh)
LDFLAGS := -s -w -X heft/shared/version.Version=$(BUILD_VERSION)
# go-nvml (the tests' NVML mock) is compiled with cgo; its header marks
# functions heft never calls as deprecated.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: help build build-cross test test-under-load vet lint demo bench bench-check fuzz version package package-security clean gpu-check

help: ## list targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

build: ## build bin/heft-agent, bin/heft-coordinator, bin/heft-sim, bin/heft-sync without cgo, as released
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./agent/cmd/heft-agent ./coordinator/cmd/heft-coordinator ./sim/cmd/heft-sim ./gateway/cmd/heft-sync

build-cross: ## check the agent builds for Linux on arm64 and for macOS on Apple silicon
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -o /dev/null ./agent/cmd/heft-agent
	CGO_ENABLED=0 GOOS=darwin GOARCH=arm64 $(GO) build -o /dev/null ./agent/cmd/heft-agent

# make test is deterministic: the same commit passes or fails the same way.
# The fuzz seed corpora (and every crash a fuzz run saved) replay as tests;
# the random search for new inputs is make fuzz, which .ci/run runs after.
test: ## every test with the race detector (fuzz seed corpora included)
	$(GO) test -race -count=1 -p $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT) $(SLOW_FIRST) ./...

test-under-load: ## make test with six CPU-bound hogs beside it (load about 8 on 2 cores); scripts/test-under-load.sh PKG... for some packages
	./scripts/test-under-load.sh

# Everything is vetted as released, without cgo; only agent/gpu has files
# for cgo alone (its tests against go-nvml's mock), vetted with cgo too. The
# race tests build every package with cgo and run go test's own vet checks.
# (Vetting all of ./... twice took 214 s of a 727 s .ci/run.)
vet: ## go vet as released (no cgo), and agent/gpu's cgo-only tests with cgo
	CGO_ENABLED=0 $(GO) vet ./...
	$(GO) vet ./agent/gpu/...

lint: vet ## gofmt, go vet, go mod tidy -diff, staticcheck (pinned in tools/go.mod)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) mod tidy -diff
	cd tools && $(GO) mod tidy -diff
	$(GO) tool -modfile=tools/go.mod staticcheck ./...

gpu-check: ## build the real-GPU check into $(BIN)/gpu-check: copy that folder to an NVIDIA host and run its run.sh (docs/install.md)
	@mkdir -p $(BIN)/gpu-check
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/gpu-check/ ./agent/cmd/heft-agent ./coordinator/cmd/heft-coordinator ./sim/cmd/heft-sim
	$(GO) test -c -race -ldflags '-s -w' -o $(BIN)/gpu-check/gpu.test ./agent/gpu
	cp scripts/gpu-check/run.sh scripts/gpu-check/*.py $(BIN)/gpu-check/

demo: build ## start a simulated fleet on loopback and print the dashboard's address
	$(GO) build -o $(BIN)/heft-demo ./scripts/demo
	$(BIN)/heft-demo --bin $(BIN)

bench: ## measure probe fidelity, cold-start immunity, probe cost, weight accuracy, coordinator scale, agent footprint, prefill fidelity and cost, routing through HAProxy and nginx, heft's own failures under load (about 75 min)
	./scripts/bench.sh

bench-check: ## the wall-clock checks make test leaves out: area 11 in miniature through HAProxy and nginx (about 2 min)
	HEFT_WALLCLOCK=1 $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -run '^TestChangesShort$$' -v ./bench/

fuzz: ## run every fuzz target for FUZZTIME seconds each (default 30)
	./scripts/fuzz.sh $(or $(FUZZTIME),30)

version: ## print the version the binaries report and the deb/rpm version
	@echo "binaries: $(BUILD_VERSION)"
	@echo "packages: $$(./scripts/version.sh --package)-$${PKG_RELEASE:-1}"

package: ## build .deb and .rpm packages into dist/ for this machine's architecture (GOARCH=arm64 for arm64; nfpm, pinned in tools/go.mod)
	./scripts/package.sh

package-security: ## print systemd-analyze security scores of the units
	@for u in packaging/systemd/*.service; do \
		t=$$(mktemp -d); sed 's|/usr/bin/heft-[a-z]*|/bin/true|' $$u > $$t/$$(basename $$u); \
		systemd-analyze security --offline=true $$t/$$(basename $$u) | tail -1; rm -rf $$t; \
	done

clean: ## remove build outputs
	rm -rf $(BIN) dist
