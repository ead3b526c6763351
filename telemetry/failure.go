package telemetry

import (
	"sync/atomic"

	"github.com/sirupsen/logrus"
)

// StoreFailedMessage is the error the store logs, once, when a failed flush
// or metadata write makes it refuse every later write and sync
// (image.ErrFailed; image/store.go, Store.fail). image.Metrics does not carry
// that state, so FailureHook learns it from this log entry;
// TestFailureHookSeesStoreFailure keeps the two in step.
const StoreFailedMessage = "store failed: refusing further writes and syncs"

// FailureHook is a logrus hook for the logger a mounted store logs to: it
// notices the store's StoreFailedMessage, and the collector serves that as
// vdiskfs_store_failed (1 from then on, until the store is reopened), for
// the "store refused writes after an I/O error" alert.
type FailureHook struct {
	failed atomic.Bool
}

// Levels implements logrus.Hook: the message is logged at error level.
func (h *FailureHook) Levels() []logrus.Level { return []logrus.Level{logrus.ErrorLevel} }

// Fire implements logrus.Hook.
func (h *FailureHook) Fire(e *logrus.Entry) error {
	if e.Message == StoreFailedMessage {
		h.failed.Store(true)
	}
	return nil
}

// StoreFailed reports whether the store has logged that it failed.
func (h *FailureHook) StoreFailed() bool { return h.failed.Load() }

// FailureSource is what a Source also implements when it knows whether the
// store refuses writes after an I/O error; without it vdiskfs_store_failed
// is 0.
type FailureSource interface {
	StoreFailed() bool
}
