package idem

import "sync/atomic"

// leaseMode chooses, from the share of duplicates the hybrid has seen
// lately, how a request uses the lease.
//
// The lease pays on duplicates (retries, reused keys, replays), which it
// answers without PostgreSQL; on a first execution it is a Redis round trip
// and its CPU on top of the claim, which decides all the same. So while
// duplicates are rare the hybrid claims first: a request goes straight to
// the claim, as in the table strategy, and its answer is still copied into
// the lease, so that the retries to come are answered by Redis once
// duplicates are frequent again. While duplicates are frequent, a request
// consults the lease first (leaseFirst), so that a storm of retries does not
// reach PostgreSQL.
//
// Both are safe in any mix, across instances and through the switch: the
// claim decides who runs either way, and claiming first writes nothing to
// the lease but the copies of committed answers (what a table-strategy
// instance of the same fleet skips altogether).
//
// A duplicate is a request answered with a replay, 409 or 422 (whoever
// answered it); a first execution is one that ran. A Guard starts leasing
// first. It claims first from the end of a window of leaseWindow such
// requests with at most enterClaimFirst duplicates, and leases first again
// as soon as a window claiming first has seen leaveClaimFirst duplicates,
// without waiting for the window's end: about leaveClaimFirst requests of a
// storm (and those already on their way) reach PostgreSQL before the lease
// answers the rest. The counts are approximate under concurrency (a window
// may lose a few requests at its end), which only moves a switch by a few
// requests.
type leaseMode struct {
	claimFirst atomic.Bool
	seen, dups atomic.Int64 // in the current window

	// The tests change these (export_test.go).
	window, enter, leave int64
}

// The lease modes' window and thresholds (docs/capacity.md says why).
const (
	leaseWindow     = 512
	enterClaimFirst = leaseWindow / 50 // 2%
	leaveClaimFirst = leaseWindow / 20 // 5%
)

// first reports whether requests claim first.
func (m *leaseMode) first() bool { return m.claimFirst.Load() }

// observe counts a request answered in the hybrid, dup telling whether its
// key had been seen before, and switches the mode when the window says so.
// It reports whether this request switched it.
func (m *leaseMode) observe(dup bool) bool {
	d := m.dups.Load()
	if dup {
		d = m.dups.Add(1)
	}
	n := m.seen.Add(1)
	switched := false
	switch first := m.claimFirst.Load(); {
	case first && d >= m.leave:
		switched = m.claimFirst.CompareAndSwap(true, false)
	case n >= m.window:
		switched = !first && d <= m.enter && m.claimFirst.CompareAndSwap(false, true)
	default:
		return false
	}
	m.seen.Store(0)
	m.dups.Store(0)
	return switched
}
