package idem

import "github.com/idemguard/idem/internal/rare"

// SetMaxWaiters changes how many requests may wait at once on g (1024), for
// a test of the bound.
func SetMaxWaiters(g *Guard, n int64) { g.maxWaiters = n }

// SetLeaseModes changes the hybrid's lease-mode window and thresholds
// (leaseWindow, leaseEnter, leaseLeave), for a test of the switch.
func SetLeaseModes(g *Guard, window, enter, leave int64) {
	g.mode = rare.New(window, enter, leave)
}

// PinClaimFirst has the hybrid claim first for good, whatever it sees.
func PinClaimFirst(g *Guard) { g.mode.Pin(true) }

// ClaimsFirst reports whether the hybrid claims first now.
func ClaimsFirst(g *Guard) bool { return g.mode.Rare() }
