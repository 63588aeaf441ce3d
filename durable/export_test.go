package durable

import "time"

// For the tests of package durable_test.
var (
	ErrStatementCache = errStatementCache
	Translate         = translate
)

// PinInsertFirst has s insert first (on) or read first for good, whatever
// its claims find.
func PinInsertFirst(s *Store, on bool) { s.newKeys.Pin(on) }

// InsertsFirst reports whether s inserts first now.
func InsertsFirst(s *Store) bool { return s.newKeys.Rare() }

// SchemaClock moves the clock on which s counts when to read its table's
// schema version again.
func SchemaClock(s *Store, now func() time.Time) { s.schema.now = now }

// SweeperTuning is what a test changes of a Sweeper; a zero field keeps the
// Sweeper's own.
type SweeperTuning struct {
	Interval     time.Duration
	BatchSize    int
	BatchPause   time.Duration // negative: no pause
	BatchTimeout time.Duration
	OnSweep      func(deleted int64, err error)
}

// TuneSweeper applies t to sw, before it runs.
func TuneSweeper(sw *Sweeper, t SweeperTuning) *Sweeper {
	if t.Interval != 0 {
		sw.interval = t.Interval
	}
	if t.BatchSize != 0 {
		sw.batch = t.BatchSize
	}
	if t.BatchPause != 0 {
		sw.pause = max(t.BatchPause, 0)
	}
	if t.BatchTimeout != 0 {
		sw.timeout = t.BatchTimeout
	}
	if t.OnSweep != nil {
		sw.onSweep = t.OnSweep
	}
	return sw
}
