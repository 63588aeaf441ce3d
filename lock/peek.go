package lock

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// Peek returns the state the lease of (scope, key) holds, as Obtain would
// return it to a caller that did not get the lease, and its remaining TTL,
// without taking, refreshing or changing it: it is for tools that look at a
// key (the idem command's inspect). ttl is 0 for a key without expiry. It
// returns ErrNotHeld when the key holds no lease.
//
// It is one round trip (GET and PTTL sent together, which Redis runs back to
// back), bounded by the Locker's Timeout, outside the Locker's shared
// exchange.
func (l *Locker) Peek(ctx context.Context, scope, key string) (state []byte, ttl time.Duration, err error) {
	cctx, cancel := l.callCtx(ctx)
	defer cancel()
	k := l.Key(scope, key)
	var (
		get  *redis.StringCmd
		pttl *redis.DurationCmd
	)
	_, err = l.client.Pipelined(cctx, func(p redis.Pipeliner) error {
		get = p.Get(cctx, k)
		pttl = p.PTTL(cctx, k)
		return nil
	})
	switch {
	case errors.Is(err, redis.Nil):
		return nil, 0, ErrNotHeld
	case err != nil:
		return nil, 0, l.wrap(ctx, "peek", err)
	}
	v, err := get.Result()
	if err != nil {
		return nil, 0, l.wrap(ctx, "peek", err)
	}
	state, _ = parseValue(v)
	return state, max(pttl.Val(), 0), nil
}
