# The README's commands, wrapped. `make test` is what .ci/run runs.
GO ?= go

.PHONY: test build lint fuzz bench run release release-check tag test-clients soak soak-kills soak-faults

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

# GOARCH=386 vets the tree where int is 32 bits: a constant that
# overflows it (a frame or record limit of 1<<31 or more) fails to compile
# there. vet type-checks the tests too, and runs none; it costs about what
# the vet before it does, a second compile of the tree, cached after.
lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	GOARCH=386 $(GO) vet ./...
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

# A release, under $(DIST)/, for linux and darwin on amd64 and arm64:
#
#   participantd-<version>-<os>-<arch>.tar.gz   static binaries of $(COMMANDS)
#                                               (no cgo), their SBOMs, LICENSE,
#                                               README.md, CHANGELOG.md
#   SHA256SUMS                                  over the archives
#
# The version has one source, internal/buildinfo/VERSION (embedded in the
# binaries, so --version, welcome.server and participantd_build_info say
# it without a stamp); the release stamps only the commit, since it builds
# with -buildvcs=false. Each binary's SBOM (CycloneDX JSON, the Go modules
# linked into it, by the pinned cyclonedx-gomod) sits beside it as
# <cmd>.cdx.json. -trimpath, -buildvcs=false, sorted tar members with fixed
# owners and times, and gzip -n make the archives reproducible from a
# commit. To cut a release: docs/operations.md, "Releases".
VERSION := $(shell cat internal/buildinfo/VERSION)
# The commit and its time (the archive members' times, reproducible), read
# once when make starts, so that a commit made during a long release build
# cannot make the check disagree with what was built.
ifeq ($(origin REVISION),undefined)
REVISION := $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
endif
ifeq ($(origin SOURCE_DATE_EPOCH),undefined)
SOURCE_DATE_EPOCH := $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
endif
DIST ?= dist
PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
# participantbench ships too: an operator measures a disk with it (its
# fsync probe and --etcd-compare) before trusting it with a deployment.
COMMANDS = participantd participantctl participantbench
BUILDINFO = github.com/participantd/participantd/internal/buildinfo
LDFLAGS = -s -w -X $(BUILDINFO).revision=$(REVISION)
CYCLONEDX ?= github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@v1.10.0

release:
	rm -rf $(DIST) && mkdir -p $(DIST)
	GOBIN=$(TOOLBIN) $(GO) install $(CYCLONEDX)
	@set -e; for p in $(PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; name=participantd-$(VERSION)-$$os-$$arch; dir=$(DIST)/$$name; \
		mkdir -p $$dir; cp LICENSE README.md CHANGELOG.md $$dir/; \
		for cmd in $(COMMANDS); do \
			echo "build $$dir/$$cmd"; \
			CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -buildvcs=false \
				-ldflags '$(LDFLAGS)' -o $$dir/$$cmd ./cmd/$$cmd; \
			$(TOOLBIN)/cyclonedx-gomod bin -json -std -noserial -notimestamp \
				-version $(VERSION) -output $$dir/$$cmd.cdx.json $$dir/$$cmd; \
		done; \
		tar -C $(DIST) --sort=name --owner=0 --group=0 --numeric-owner \
			--mtime=@$(SOURCE_DATE_EPOCH) -cf - $$name | gzip -n > $$dir.tar.gz; \
		rm -rf $$dir; \
	done
	cd $(DIST) && sha256sum *.tar.gz > SHA256SUMS

# What CI checks of a release: the sums verify; every platform's archive
# holds every binary, its SBOM (naming this version), LICENSE, README.md
# and CHANGELOG.md; and the host's binaries print this version, and the
# commit, on one line.
release-check: release
	cd $(DIST) && sha256sum -c --quiet SHA256SUMS
	@set -e; for p in $(PLATFORMS); do os=$${p%/*}; arch=$${p#*/}; name=participantd-$(VERSION)-$$os-$$arch; \
		members=$$(tar -tzf $(DIST)/$$name.tar.gz); \
		for f in LICENSE README.md CHANGELOG.md $(COMMANDS) $(addsuffix .cdx.json,$(COMMANDS)); do \
			echo "$$members" | grep -qx "$$name/$$f" || { echo "$$name.tar.gz lacks $$f"; exit 1; }; \
		done; \
	done
	@set -e; host=participantd-$(VERSION)-$$($(GO) env GOOS)-$$($(GO) env GOARCH); \
	tmp=$$(mktemp -d); tar -C $$tmp -xzf $(DIST)/$$host.tar.gz; \
	for cmd in $(COMMANDS); do \
		out=$$($$tmp/$$host/$$cmd --version); echo "$$out"; \
		echo "$$out" | grep -qx "$$cmd $(VERSION) (commit $$(echo $(REVISION) | cut -c1-12); go.*)" || \
			{ echo "$$cmd --version does not print one line with $(VERSION) and the commit"; exit 1; }; \
		grep -q '"version": "$(VERSION)"' $$tmp/$$host/$$cmd.cdx.json || \
			{ echo "$$cmd.cdx.json does not name $(VERSION)"; exit 1; }; \
	done; rm -rf $$tmp

# Tags the commit as the VERSION file's release, once it names one (no
# -dev) and the tree is clean; pushing the tag is the maintainer's.
tag:
	@case "$(VERSION)" in *-dev*) echo "internal/buildinfo/VERSION is $(VERSION): a release drops -dev"; exit 1;; esac
	@git diff --quiet HEAD || { echo "the work tree has changes"; exit 1; }
	git tag -a $(VERSION) -m "participantd $(VERSION)"

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

# The release soak (docs/operations.md, Release soak): the participantd
# binary SIGKILLed in SOAK_ROUNDS rounds of tells into one conversation
# whose history grows past SOAK_ROWS rows, checkpoints and compaction
# running all the time, receivers moving between connections; after every
# restart each answered tell (the killed round's, SOAK_SAMPLE of the older
# ones, and all of them after the last round) is retried with its token and
# must answer its original seq, and every answered tell is delivered to each
# receiver with its payload. About 15 minutes on 2 cores.
SOAK_ROUNDS ?= 1000
SOAK_ROWS ?= 100000
SOAK_SAMPLE ?= 1000
soak: soak-kills soak-faults
soak-kills:
	$(GO) test -count=1 -timeout 0 -run 'TestSoak_AnsweredSurviveKills$$' -v ./cmd/participantd/e2e \
		-soak-rounds $(SOAK_ROUNDS) -soak-rows $(SOAK_ROWS) -soak-sample $(SOAK_SAMPLE)

# The fault half of the release soak: the service's in-process fault
# models at ten times the cuts of a test run (-long): a power cut at every
# file-system call of each workload many times over, each under the strict
# crash model (torn prefixes, sectors kept or lost, bbolt commits torn),
# with the offline tools run on what every cut left; the Linux fsync
# failure at every sync; the bit flips of every byte; the cut at every
# store call; and the model checker at SOAK_MODEL_ITERS sequences.
SOAK_MODEL_ITERS ?= 2000
soak-faults:
	$(GO) test -count=1 -timeout 0 -run 'TestPowerCut|TestBitFlip|TestCrashCut|TestModel$$' -v ./participant/ \
		-long -model.iters $(SOAK_MODEL_ITERS)
