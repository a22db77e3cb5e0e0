# The README's commands, wrapped. `make test` is what .ci/run runs.
GO ?= go

.PHONY: test build lint fuzz bench run

build:
	$(GO) build ./...

test:
	$(GO) vet ./...
	$(GO) test -race -timeout 20m ./...

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

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
