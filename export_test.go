package idem

import "math"

// SetMaxWaiters changes how many requests may wait at once on g (1024), for
// a test of the bound.
func SetMaxWaiters(g *Guard, n int64) { g.maxWaiters = n }

// SetLeaseModes changes the hybrid's lease-mode window (leaseWindow) and
// thresholds (enterClaimFirst, leaveClaimFirst), for a test of the switch.
func SetLeaseModes(g *Guard, window, enter, leave int64) {
	g.mode.window, g.mode.enter, g.mode.leave = window, enter, leave
}

// PinClaimFirst has the hybrid claim first for good, whatever it sees.
func PinClaimFirst(g *Guard) {
	g.mode.leave = math.MaxInt64
	g.mode.claimFirst.Store(true)
}

// ClaimsFirst reports whether the hybrid claims first now.
func ClaimsFirst(g *Guard) bool { return g.mode.first() }
