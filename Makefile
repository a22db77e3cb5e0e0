# The README's commands, wrapped. `make test` is what .ci/run runs.
GO ?= go

.PHONY: test build lint fuzz bench run release release-check test-clients

build:
	$(GO) build ./...

# The second run is the server's wire tests again, every client dialling
# the WebSocket listener (-ws): about a minute. -short leaves out the long
# variants and the race detector is off, both covered by the first run
# (the WebSocket adapter's own tests included).
test:
	$(GO) vet ./...
	$(GO) test -race -timeout 20m ./...
	$(GO) test -short -timeout 10m ./server -args -ws

# staticcheck is pinned, so that lint runs the same checks on every machine;
# go run fetches it through the module proxy the first time.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

# checklocks (gVisor's, as tailscale runs it) proves the lock annotations
# of participant, cluster and server: a field marked // +checklocks:mu is
# touched only with mu held, a function so marked is called only with it
# held, and a field used under a mutex nearly always but not marked is
# reported. It is pinned to a pseudo-version of gVisor's go branch (the
# one that builds with plain go) and installed into $(TOOLBIN) through the
# module proxy the first time; go vet runs it with its build cache.
CHECKLOCKS ?= gvisor.dev/gvisor/tools/checklocks/cmd/checklocks@v0.0.0-20260905035102-160fafc42237
TOOLBIN ?= $(CURDIR)/bin/tools

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	GOBIN=$(TOOLBIN) $(GO) install $(CHECKLOCKS)
	$(GO) vet -vettool=$(TOOLBIN)/checklocks ./participant/ ./cluster/ ./server/

# Each fuzz target briefly; raise FUZZTIME for a real session.
FUZZTIME ?= 20s
fuzz:
	$(GO) test ./wire -run '^$$' -fuzz '^FuzzReadFrame$$' -fuzztime $(FUZZTIME)
	$(GO) test ./wire -run '^$$' -fuzz '^FuzzDecodeRequest$$' -fuzztime $(FUZZTIME)
	$(GO) test ./wire -run '^$$' -fuzz '^FuzzDecodeServerMessage$$' -fuzztime $(FUZZTIME)
	$(GO) test ./oplog -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME)
	$(GO) test ./outbox -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME)
	$(GO) test ./outbox -run '^$$' -fuzz '^FuzzValidate$$' -fuzztime $(FUZZTIME)
	$(GO) test ./store -run '^$$' -fuzz '^FuzzDecodeEntryKey$$' -fuzztime $(FUZZTIME)
	$(GO) test ./store -run '^$$' -fuzz '^FuzzParseMeta$$' -fuzztime $(FUZZTIME)
	$(GO) test ./store -run '^$$' -fuzz '^FuzzCheckFile$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 1x
	$(GO) test ./store -run '^$$' -fuzz '^FuzzOpenReadOnly$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 1x
	$(GO) test ./store -run '^$$' -fuzz '^FuzzOpen$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 1x
	$(GO) test ./participant -run '^$$' -fuzz '^FuzzReadRegistry$$' -fuzztime $(FUZZTIME)
	$(GO) test ./participant -run '^$$' -fuzz '^FuzzLookupToken$$' -fuzztime $(FUZZTIME)
	$(GO) test ./store/wal -run '^$$' -fuzz '^FuzzDecodeBody$$' -fuzztime $(FUZZTIME)
	$(GO) test ./store/wal -run '^$$' -fuzz '^FuzzScanSegment$$' -fuzztime $(FUZZTIME)

bench:
	$(GO) test -run '^$$' -bench . -benchtime 2s ./store ./store/logfirst ./participant ./wire

run:
	$(GO) run ./cmd/participantd

# A release: static binaries (no cgo) of $(COMMANDS) for linux and darwin
# on amd64 and arm64 under $(DIST)/, named
# <cmd>-<VERSION>-<os>-<arch>, and $(DIST)/SHA256SUMS over them. VERSION is
# stamped into --version (internal/buildinfo); tag the commit with it
# (git tag v0.2.0) so `go install .../cmd/participantd@v0.2.0` fetches the
# same source. -trimpath and -buildvcs=false keep the build reproducible.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo v0.0.0-unknown)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
DIST ?= dist
PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
# participantbench ships too: an operator measures a disk with it (its
# fsync probe and --etcd-compare) before trusting it with a deployment.
COMMANDS = participantd participantctl participantbench
BUILDINFO = github.com/participantd/participantd/internal/buildinfo
LDFLAGS = -s -w -X $(BUILDINFO).version=$(VERSION) -X $(BUILDINFO).revision=$(REVISION)

release:
	rm -rf $(DIST) && mkdir -p $(DIST)
	@set -e; for p in $(PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; \
		for cmd in $(COMMANDS); do \
			echo "build $(DIST)/$$cmd-$(VERSION)-$$os-$$arch"; \
			CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -buildvcs=false \
				-ldflags '$(LDFLAGS)' -o $(DIST)/$$cmd-$(VERSION)-$$os-$$arch ./cmd/$$cmd; \
		done; \
	done
	cd $(DIST) && sha256sum $(addsuffix -*,$(COMMANDS)) > SHA256SUMS

# What CI checks of a release: every binary built, the sums verify, and the
# host's binaries print the stamped version.
release-check: release
	cd $(DIST) && sha256sum -c --quiet SHA256SUMS
	@set -e; host=$$($(GO) env GOOS)-$$($(GO) env GOARCH); \
	for cmd in $(COMMANDS); do \
		out=$$($(DIST)/$$cmd-$(VERSION)-$$host --version); echo "$$out"; \
		echo "$$out" | grep -q "^module github.com/participantd/participantd $(VERSION)$$" || \
			{ echo "$$cmd --version does not print $(VERSION)"; exit 1; }; \
	done
	@for p in $(PLATFORMS); do os=$${p%/*}; arch=$${p#*/}; for cmd in $(COMMANDS); do \
		test -x $(DIST)/$$cmd-$(VERSION)-$$os-$$arch || { echo "missing $$cmd for $$os/$$arch"; exit 1; }; done; done

# The TypeScript client (clients/typescript): builds participantd (and
# etcd-dev, participantctl, whose inspect reads the nemesis test's history)
# for its integration tests, installs the package's dependencies from its
# lock file, type-checks (the README's snippet too) and runs the unit
# (the codec; what npm pack would publish), integration (TCP, WebSocket,
# each call's answer against the server, a short nemesis run, a 3-node
# cluster over cmd/etcd-dev) and browser (headless Chromium at
# $(CHROMIUM)) tests. The nemesis's longer run: npm run test:nemesis.
CHROMIUM ?= /usr/bin/chromium
test-clients:
	$(GO) build -o clients/typescript/.bin/ ./cmd/participantd ./cmd/etcd-dev ./cmd/participantctl
	cd clients/typescript && npm ci --no-audit --no-fund && \
		TS_PARTICIPANTD_BIN=$(CURDIR)/clients/typescript/.bin/participantd CHROMIUM=$(CHROMIUM) npm test
