package participant

import (
	"errors"
	"sync"

	"github.com/participantd/participantd/store"
)

// storeFailure records the store's sticky failure (store.ErrFailed: a
// failed fsync, a full disk), which no operation of this process can get
// past: every later write is refused until a restart reopens the store and
// reconciles.
type storeFailure struct {
	once sync.Once
	// done is closed once err is set.
	done chan struct{}
	err  error
}

func newStoreFailure() storeFailure {
	return storeFailure{done: make(chan struct{})}
}

// noteStoreErr records err when it is the store's sticky failure, and logs
// it, at error level, the first time only. Any other error, nil included,
// is ignored: a refusal or a transient failure leaves the store usable.
func (s *Service) noteStoreErr(err error) {
	if !errors.Is(err, store.ErrFailed) {
		return
	}
	s.failure.once.Do(func() {
		s.failure.err = err
		close(s.failure.done)
		s.log.Error().Err(err).Msg("the store failed; every write is refused until a restart reconciles it")
	})
}

// StoreFailed returns a channel that is closed once an operation, a
// reconciliation or a reload met the store's sticky failure. The service
// then answers every write unavailable or in_doubt; the owner should stop
// serving and restart, so that a new process reopens the store and
// reconciles.
func (s *Service) StoreFailed() <-chan struct{} { return s.failure.done }

// Failed returns the store's sticky failure (errors.Is store.ErrFailed)
// once StoreFailed is closed, and nil before.
func (s *Service) Failed() error {
	select {
	case <-s.failure.done:
		return s.failure.err
	default:
		return nil
	}
}
