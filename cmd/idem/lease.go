package main

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/lock"
)

// leaseInfo is what the hybrid strategy's lease of a key says, as read by
// inspect -redis.
type leaseInfo struct {
	RedisKey string `json:"redis_key"`
	Found    bool   `json:"found"`
	// State is what the Guard wrote (idem's lease.go): claiming, running,
	// pending, answer (a copy of the row's answer), done (an answer too
	// large to copy) or unknown (a format this build does not read).
	State       string `json:"state,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
	// SameRequest reports whether the lease's fingerprint is the row's.
	SameRequest bool  `json:"same_request"`
	Status      int   `json:"status,omitempty"` // of an answer's copy
	TTLMS       int64 `json:"ttl_ms"`
}

// leaseKinds names the first byte of the Guard's lease states (lease.go),
// each followed by the fingerprint, and for an answer's copy by its status.
// Package idem keeps the format unexported; TestInspectLease reads leases a
// real hybrid Guard wrote, so a change of the format fails it.
var leaseKinds = map[byte]string{
	'c': "claiming", 'r': "running", 'p': "pending", 'A': "answer", 'd': "done",
}

func (l *leaseInfo) describe() string {
	if !l.Found {
		return fmt.Sprintf("none at %s", l.RedisKey)
	}
	s := fmt.Sprintf("%s at %s, %s left", l.State, l.RedisKey, human(time.Duration(l.TTLMS)*time.Millisecond))
	if l.Status != 0 {
		s += fmt.Sprintf(", status %d", l.Status)
	}
	switch {
	case l.Fingerprint == "":
	case l.SameRequest:
		s += ", the row's fingerprint"
	default:
		s += ", fingerprint " + l.Fingerprint + " (not the row's)"
	}
	return s
}

// peekLease reads the lease of row's key at addr, without changing it.
func peekLease(ctx context.Context, addr, prefix string, row durable.KeyRow) (*leaseInfo, error) {
	client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer client.Close()
	locker, err := lock.New(client, &lock.Config{Prefix: prefix, Timeout: 5 * time.Second})
	if err != nil {
		return nil, usageError{err.Error()}
	}
	info := &leaseInfo{RedisKey: locker.Key(row.Scope, row.Key)}
	state, ttl, err := locker.Peek(ctx, row.Scope, row.Key)
	switch {
	case errors.Is(err, lock.ErrNotHeld):
		return info, nil
	case err != nil:
		return nil, fmt.Errorf("inspect -redis %s: %w", addr, err)
	}
	info.Found, info.TTLMS = true, ttl.Milliseconds()
	info.State = "unknown"
	if len(state) >= 1+len(row.Fingerprint) {
		if k, ok := leaseKinds[state[0]]; ok {
			info.State = k
		}
		fp := state[1 : 1+len(row.Fingerprint)]
		info.Fingerprint = hex.EncodeToString(fp)
		info.SameRequest = string(fp) == string(row.Fingerprint[:])
		if rest := state[1+len(row.Fingerprint):]; state[0] == 'A' && len(rest) >= 2 {
			info.Status = int(binary.BigEndian.Uint16(rest))
		}
	}
	return info, nil
}
