package idem

import (
	"crypto/rand"
	"encoding/hex"
	"sync/atomic"

	"github.com/idemguard/idem/durable"
)

// Stats counts a Guard's decisions since it was created. Every field only
// grows.
type Stats struct {
	Executed         uint64 // work ran, answer stored
	Pending          uint64 // work ran, answer unknown or not stored: key left in progress
	Released         uint64 // work declared nothing happened, or Guard.Release
	Replayed         uint64 // stored answer returned
	InProgress       uint64 // refused with ErrInProgress
	KeyReused        uint64 // refused with ErrKeyReused
	Settled          uint64 // Guard.Settle calls that stored an answer
	Fallbacks        uint64 // hybrid requests that fell back to the table claim (Redis unavailable)
	StoreErrors      uint64 // store calls that failed (claim, read, complete, insert, release)
	LockLost         uint64 // hybrid leases found expired when released
	DoubleExecutions uint64 // hybrid rows found already written after the work ran
}

type stats struct {
	executed, pending, released, replayed, inProgress, keyReused, settled,
	fallbacks, storeErrors, lockLost, doubleExecutions atomic.Uint64
}

// Stats returns a snapshot of the counters. Safe to call concurrently.
func (g *Guard) Stats() Stats {
	s := &g.stats
	return Stats{
		Executed: s.executed.Load(), Pending: s.pending.Load(), Released: s.released.Load(),
		Replayed: s.replayed.Load(), InProgress: s.inProgress.Load(), KeyReused: s.keyReused.Load(),
		Settled: s.settled.Load(), Fallbacks: s.fallbacks.Load(), StoreErrors: s.storeErrors.Load(),
		LockLost: s.lockLost.Load(), DoubleExecutions: s.doubleExecutions.Load(),
	}
}

func newToken() durable.Token {
	var t durable.Token
	_, _ = rand.Read(t[:]) // never fails (crypto/rand.Read documents so since Go 1.24)
	return t
}

// keyHash identifies an intent in logs without revealing the key: the first
// 8 bytes of its digest, in hex.
func keyHash(req Request) string {
	fp := HashParts([]byte(req.Scope), []byte(req.Key))
	return hex.EncodeToString(fp[:8])
}
