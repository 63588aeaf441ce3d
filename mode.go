package idem

import "github.com/idemguard/idem/internal/rare"

// The hybrid's lease modes: from the share of duplicates it has seen lately
// (g.mode, a rare.Window), the hybrid chooses how a request uses the lease.
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
// first, claims first from the end of a window of leaseWindow such requests
// with at most leaseEnter duplicates, and leases first again at the
// leaseLeave-th duplicate of a window claiming first.

// The lease modes' window and thresholds: 10% and 20% of 512 requests. The
// lease takes a duplicate's read off PostgreSQL (about 30 µs of its CPU) and
// costs each first execution a Redis round trip (about 35 µs of the
// process's and Redis's CPU), so below a tenth of duplicates it saves
// PostgreSQL next to nothing, and where they share cores it costs
// throughput until about half the requests are duplicates
// (docs/capacity.md). A storm still switches within 102 duplicates.
const (
	leaseWindow = rare.Size
	leaseEnter  = rare.Size / 10
	leaseLeave  = rare.Size / 5
)
