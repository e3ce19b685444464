# rdmanet: rsock, net.Conn over RDMA.
#
#   make demo    stock net/http over rsock on this machine, with the transport
#   make test    every test under the race detector, then real RDMA on Soft-RoCE in a VM (what CI runs)
#   make lint    go vet and staticcheck
#   make bench   rsockperf compare: rsock against plain TCP, two processes, every transport here;
#                rewrites BENCHMARKS.md's generated region and docs/bench/
#   make fuzz    each fuzz target for FUZZTIME (default 30s)
#
# Two modules: the library (this directory: rsock and what it needs) and
# tools/ (rsockperf, the examples and the end-to-end suites, with gRPC,
# plotting and the third-party clients), which uses the library through a
# replace. Each target covers both.

GO        ?= go
FUZZTIME  ?= 30s
STATICCHECK_VERSION ?= v0.8.2

# Packages with fuzz targets, and the targets in each.
FUZZ_TARGETS = \
	./internal/handshake:FuzzDecode \
	./internal/handshake:FuzzRoundTrip \
	./internal/handshake:FuzzNext \
	./internal/ring:FuzzProtocol \
	./internal/ring:FuzzReceive \
	./internal/ring:FuzzUnmarshal \
	./internal/verbs/ibverbs:FuzzParseInfo \
	./internal/verbs/shm:FuzzDecodeInfo \
	./internal/verbs/shm:FuzzDecodeMessage \
	./rsock:FuzzInbox \
	./rsock:FuzzSwitching

.PHONY: all deps demo test test-unit lint bench bench-go fuzz clean

all: lint test

demo:
	cd tools && $(GO) run ./examples/httpserver -demo

# The seed corpora under testdata/fuzz run as ordinary tests here. The
# Soft-RoCE VM run comes last: its final line is the "N passed, M failed"
# summary of the real-RDMA checks.
test: test-unit test-softroce

# Debian packages the tests use: curl drives the example server in e2e;
# gcc (cgo, -race), libibverbs-dev and librdmacm-dev, whose
# <infiniband/verbs.h> and <rdma/rdma_cma.h> the verbs provider's ABI
# declarations are checked against (nothing links either library);
# chromium loads the example's /debug/rsock page headless (examples/httpserver),
# and the test keeps its screenshot in .artifacts/.
DEB_PACKAGES = curl ca-certificates gcc libc6-dev libibverbs-dev librdmacm-dev chromium
deps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; fi

# Besides the tests: the module and its tests build and vet without cgo
# (verbs then reports itself unavailable), and shim.h matches the real libibverbs and librdmacm ABIs.
# rsock and rsockperf build (and rsock vets) off Linux, where rsock is TCP
# only; TestTCPOnlyPlatform and the Examples run that build's behaviour here
# (rsock_tcponly).
OFFLINUX = darwin/amd64 darwin/arm64 windows/amd64 freebsd/amd64
test-unit: deps
	$(GO) version
	$(GO) vet ./...
	cd tools && $(GO) vet ./...
	CGO_ENABLED=0 $(GO) build ./...
	cd tools && CGO_ENABLED=0 $(GO) build ./...
	CGO_ENABLED=0 $(GO) vet ./...
	cd tools && CGO_ENABLED=0 $(GO) vet ./...
	@extra=$$($(GO) list -m -f '{{if not (or .Main .Indirect)}}{{.Path}}{{end}}' all | grep -vxE 'golang.org/x/(sys|net)|github.com/libp2p/go-buffer-pool|github.com/stretchr/testify'); \
	test -z "$$extra" || { echo "the library module requires more than x/sys, the buffer pool, x/net and testify: $$extra"; exit 1; }
	@for p in $(OFFLINUX); do echo "GOOS=$${p%/*} GOARCH=$${p#*/}: build, vet"; \
		GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) build ./rsock/... && \
		(cd tools && GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) build -o /dev/null ./cmd/rsockperf) && \
		GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) vet ./rsock/... ./internal/sysdep ./internal/transport ./internal/doctor || exit 1; done
	GOARCH=386 $(GO) vet ./... # the tests compile where int is 32 bits
	$(GO) test -race -count=1 -tags rsock_tcponly -run '^(TestTCPOnlyPlatform|Example.*)$$' ./rsock/...
	$(GO) vet -tags ibverbs_abicheck ./internal/verbs/ibverbs
	RSOCK_ARTIFACTS=$(CURDIR)/.artifacts $(GO) test -race -count=1 -timeout 30m ./...
	cd tools && RSOCK_ARTIFACTS=$(CURDIR)/.artifacts $(GO) test -race -count=1 -timeout 30m ./...

lint:
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	cd tools && $(GO) vet ./... && $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed:"; gofmt -l .; exit 1; }

# rsockperf compare over every transport (verbs only where a connection
# really gets it: otherwise it is reported unavailable, never replaced),
# each mode against its own server process, interleaved with repeats. It
# prints the tables, and rewrites only the region between the
# <!-- rsockperf:begin/end --> markers of BENCHMARKS.md, the SVG plots in
# docs/bench/ and docs/bench/results.json. BENCH_FLAGS=--quick for a short run.
BENCH_TRANSPORTS ?= all
BENCH_FLAGS ?=
bench:
	cd tools && $(GO) build -o ../bin/rsockperf ./cmd/rsockperf
	./bin/rsockperf compare --transports $(BENCH_TRANSPORTS) $(BENCH_FLAGS) \
		--plot docs/bench --json-file docs/bench/results.json --markdown BENCHMARKS.md

# The in-process go test benchmarks of rsock/ (the earlier make bench): six
# repeats, each running every variant once; benchstat prints medians and spread.
BENCHSTAT_VERSION ?= latest
bench-go:
	$(GO) test -c -o bench.test ./rsock/
	@for i in 1 2 3 4 5 6; do ./bench.test -test.run '^$$' -test.bench . -test.benchtime 3000x -test.benchmem; done | tee bench.out
	$(GO) run golang.org/x/perf/cmd/benchstat@$(BENCHSTAT_VERSION) bench.out

fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "== $$pkg $$name ($(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	done

clean:
	$(GO) clean -testcache

# ---- test-softroce: begin (Soft-RoCE harness, test/softroce/; part of `make test`) ----
# Real verbs without an RDMA NIC: a Debian kernel under QEMU (TCG) with rdma_rxe.
# Installs its Debian packages (root or sudo), caches under .cache/softroce.
#   make test-softroce                      the project's verbs tests (test/softroce/suite.sh):
#                                           conformance, rsock and e2e over verbs in one guest,
#                                           then rsock across two guests
#   make softroce-checks                    only the harness's built-in checks, one guest
#   make softroce-checks SOFTROCE_ARGS='--two-hosts --bin x.test --test x="x.test -test.v"'
SOFTROCE_ARGS ?=

.PHONY: test-softroce softroce-checks

test-softroce:
	GO="$(GO)" bash test/softroce/suite.sh

softroce-checks:
	GO="$(GO)" bash test/softroce/run.sh $(SOFTROCE_ARGS)
# ---- test-softroce: end ----
