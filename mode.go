package idem

// The hybrid's lease modes: from the share of duplicates it has seen lately
// (g.mode, a rare.Window), the hybrid chooses how a request uses the lease.
//
// The lease pays on duplicates (retries, reused keys, replays), which it
// answers without PostgreSQL; on a first execution it is a Redis round trip
// and its CPU on top of the claim, which decides all the same. So while
// duplicates are rare the hybrid claims first: a request goes straight to
// the claim, as in the table strategy, and writes nothing to the lease, as
// a table-strategy instance of the same fleet would not (copying answers
// that only the rare retries would read cost each first execution 10 to 17%
// of its process's CPU over HTTP, docs/capacity.md). While duplicates are
// frequent, a request consults the lease first (leaseFirst), so that a storm
// of retries does not reach PostgreSQL: a key answered while the hybrid
// claimed first has no copy, so its first retry takes the lease and reads
// the row, which copies the answer into the lease for the retries after it.
//
// Both are safe in any mix, across instances and through the switch: the
// claim decides who runs either way, and a lease that a request claiming
// first did not replace (another instance's, leasing first, that lost the
// claim) is answered as one whose copy was lost: 409 until it is staleLease
// old, then the row.
//
// A duplicate is a request answered with a replay, 409 or 422 (whoever
// answered it); a first execution is one that ran. A Guard starts leasing
// first, claims first from the end of a window of rare.Size such requests
// with at most rare.Enter duplicates, and leases first again at the
// rare.Leave-th duplicate of a window claiming first.
