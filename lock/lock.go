// Package lock is idem's Redis lease: a short-lived, owner-checked record of
// what is known about one idempotency key, so that requests that must not run
// can be answered at Redis speed.
//
// The value of a lease is a random owner token, the TTL the key was last
// given ("|30000|", in milliseconds), then a state: opaque bytes that the
// caller chooses (idem stores "running with this fingerprint" and, once the
// answer is committed, a copy of it). [Locker.Obtain] takes a free key or, in
// the same round trip, returns the state it holds and its remaining TTL: SET
// <key> <value> NX GET PX <ttl>, then PTTL <key>, sent together. The TTL in
// the value is what the age of a held lease is measured against (see
// [Locker.TryLock]), so that Lockers with different Config.TTLs can share
// keys. Replacing and releasing are one compare-and-act Lua script
// (embedded from replace.lua) that checks the token: nobody can change a
// lease they do not hold, even after theirs has expired and another caller
// has taken the key. [Locker.Set] and [Locker.Delete] act whoever holds the
// key, for a caller that knows the key's state from elsewhere.
//
// A Locker keeps one exchange with Redis out at a time: a command sent while
// none is out goes at once, and the commands that arrive meanwhile go
// together as one pipeline when it returns, in the order they came, each
// caller still bounded by its own deadline. Under load that is one round
// trip's system calls for many requests' leases, on both sides. [Locker.Set]
// does not wait at all: its write joins the next exchange, ahead of every
// command the Locker is given after it, and a callback learns how it went.
//
// The Redis key is derived from (scope, key) through SHA-256, so that any two
// different intents get different Redis keys whatever bytes their scope and key
// hold (no user input can forge another scope's key), and each intent lives in
// one Redis Cluster hash slot (the digest is the hash tag).
//
// The package takes a [redis.UniversalClient], so a single node, Redis Cluster,
// Sentinel and miniredis all work unchanged, over a client that honours
// context deadlines and does not retry ([New] refuses one that does not). It
// needs Redis 7.0 or later (SET with both NX and GET).
//
// A lease is not a guarantee of mutual exclusion on its own: it expires after
// its TTL whether or not the holder is done, and Redis can lose it (failover,
// restart, eviction). idem never relies on it alone: the request that holds
// the lease still claims its durable row in PostgreSQL, and that claim
// decides who runs.
package lock

import (
	"context"
	"crypto/rand"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idem"
)

// Errors returned by this package. Compare with errors.Is: the returned errors
// wrap these sentinels together with their cause.
var (
	// ErrNotObtained means another caller holds the lease for that intent.
	ErrNotObtained = errors.New("lock: not obtained")
	// ErrNotHeld means the lease has expired or was taken over: the caller no
	// longer owns the key.
	ErrNotHeld = errors.New("lock: not held")
	// ErrUnavailable means Redis could not answer (connection refused or
	// reset, timeout, error reply). The error that wraps it wraps the cause
	// too.
	ErrUnavailable = errors.New("lock: redis unavailable")
)

//go:embed replace.lua
var replaceSrc string

// Config tunes a Locker. A nil *Config is valid and gives every default.
type Config struct {
	// Prefix starts every Redis key the Locker writes. It must not contain
	// '{' or '}', which would change the Cluster hash tag. Defaults to "idem:".
	Prefix string
	// TTL is how long a lease lives unless its holder replaces it with
	// another TTL. Redis expires it after that, so a crashed holder frees
	// the key by itself. Must be a whole number of seconds of at least 1s.
	// Defaults to 30s.
	TTL time.Duration
	// Timeout bounds each Redis call when the caller's context has no earlier
	// deadline, so that a stalled Redis (or a client whose pool is
	// exhausted) is reported as ErrUnavailable quickly rather than holding
	// a request. The client must honour context deadlines (see New).
	// Defaults to 500ms.
	Timeout time.Duration
}

const (
	defaultPrefix  = "idem:"
	defaultTTL     = 30 * time.Second
	defaultTimeout = 500 * time.Millisecond
)

func (c *Config) withDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Prefix == "" {
		out.Prefix = defaultPrefix
	}
	if out.TTL == 0 {
		out.TTL = defaultTTL
	}
	if out.Timeout == 0 {
		out.Timeout = defaultTimeout
	}
	return out
}

func (c Config) validate() error {
	switch {
	case strings.ContainsAny(c.Prefix, "{}"):
		return fmt.Errorf("lock: Config.Prefix %q must not contain '{' or '}'", c.Prefix)
	case c.TTL < time.Second || c.TTL%time.Second != 0:
		return fmt.Errorf("lock: Config.TTL %v must be a whole number of seconds, at least 1s", c.TTL)
	case c.Timeout < 0:
		return fmt.Errorf("lock: Config.Timeout %v must not be negative", c.Timeout)
	}
	return nil
}

// Locker obtains leases. It is safe for concurrent use. Its commands share
// one exchange with Redis at a time: one sent while none is out goes at once,
// and those that arrive meanwhile go together as one pipeline after it, which
// under concurrency costs Redis and the caller a fraction of a round trip
// each. It keeps no state about keys.
type Locker struct {
	client  redis.UniversalClient
	cfg     Config
	pipe    *pipeline
	replace *redis.Script
}

// New returns a Locker over client. A nil cfg gives every default. It does not
// contact Redis.
//
// New reads the options of a *redis.Client (which NewFailoverClient also
// returns), a *redis.ClusterClient or a *redis.Ring, and refuses two
// settings:
//   - ContextTimeoutEnabled false: go-redis then ignores a context's
//     deadline, and Config.Timeout is such a deadline; a stalled Redis would
//     hold requests for the client's ReadTimeout.
//   - MaxRetries other than -1 (a Client or a Ring retries 3 times when it
//     is 0; a ClusterClient does not): a command resent after its reply was
//     lost reports the first one's effect as a failure (a lease its holder
//     released as not held), and retries with backoff hold a request while
//     Redis refuses connections. A ClusterClient still resends a command
//     whose node failed, up to MaxRedirects times, which it needs to follow
//     MOVED and ASK; Obtain knows its own lease in the reply to a resent SET.
//
// It does not refuse a DialTimeout of Config.Timeout or longer, nor
// go-redis's five dials per connection: Config.Timeout bounds each call
// whatever they are. DialerRetries: 1 makes a call fail at once when Redis
// refuses connections rather than at its Timeout, and a DialTimeout shorter
// than the Timeout frees sooner a call that waits on a dial already out;
// docs/configuration.md gives the client setup.
func New(client redis.UniversalClient, cfg *Config) (*Locker, error) {
	if client == nil {
		return nil, errors.New("lock: nil redis client")
	}
	if err := checkClient(client); err != nil {
		return nil, err
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	l := &Locker{client: client, cfg: c, replace: redis.NewScript(replaceSrc)}
	l.pipe = &pipeline{client: client, timeout: c.Timeout, linger: defaultLinger, scripts: []*redis.Script{l.replace}}
	return l, nil
}

// TTL returns the lease lifetime the Locker sets.
func (l *Locker) TTL() time.Duration { return l.cfg.TTL }

// Key returns the Redis key of the intent (scope, key): the prefix followed by
// a hash tag holding idem.KeyHash(scope, key), the key_hash of the guard's
// log lines. Different (scope, key) pairs always give different Redis keys.
func (l *Locker) Key(scope, key string) string {
	return l.cfg.Prefix + "{" + idem.KeyHash(scope, key) + "}"
}

// Obtain takes the lease of (scope, key) with state as its value, in one
// round trip, and never waits for a held lease: the caller decides what a busy
// key means. When another caller holds the key, Obtain returns the state that
// caller wrote (nil for a lease written without state) and ErrNotObtained; a
// SET the client sent again after losing its reply, which finds the lease
// its first send took, obtains it.
//
// Errors: ErrNotObtained when the key is held; ErrUnavailable (wrapped with
// the cause) when Redis did not answer within the Timeout; the context's own
// error when ctx ended first.
func (l *Locker) Obtain(ctx context.Context, scope, key string, state []byte) (*Lease, []byte, error) {
	lease, held, _, err := l.obtainOrRead(ctx, scope, key, state)
	return lease, held, err
}

// obtainOrRead is Obtain that also returns, for a held key, how long ago its
// value was written or last given a TTL, by Redis's clock: the TTL the value
// records (its writer's, whatever this Locker's Config.TTL) less the
// remaining TTL. The age is negative when it cannot be told: a value written
// by an older version records no TTL, and a remaining TTL longer than the one
// recorded means Redis's clock stepped back since it was set.
//
// A held value that starts with this call's token is this call's own lease,
// taken by an earlier send of the same SET whose reply was lost: the lease
// is obtained.
//
// The SET and the PTTL go in one pipeline on one connection, so Redis runs
// them back to back; should another client's command come between them all
// the same (a delete, a new copy), the age is of the key's newer value, which
// only changes how long a caller keeps refusing on the older state.
func (l *Locker) obtainOrRead(ctx context.Context, scope, key string, state []byte) (*Lease, []byte, time.Duration, error) {
	lease := &Lease{locker: l, key: l.Key(scope, key), token: rand.Text()}
	cctx, cancel := l.callCtx(ctx)
	defer cancel()
	var pttl *redis.DurationCmd
	cmd, err := l.pipe.do(cctx, 2, func(ctx context.Context, c redis.Cmdable) redis.Cmder {
		set := c.SetArgs(ctx, lease.key, lease.value(state, l.cfg.TTL), redis.SetArgs{Mode: "NX", Get: true, TTL: l.cfg.TTL})
		pttl = c.PTTL(ctx, lease.key)
		return set
	})
	switch {
	case errors.Is(err, redis.Nil): // the key was free: SET took it
		return lease, nil, 0, nil
	case err != nil:
		return nil, nil, 0, l.wrap(ctx, "obtain", err)
	}
	v := cmd.(*redis.StatusCmd).Val()
	if strings.HasPrefix(v, lease.token) {
		// This SET was sent again after its reply was lost (a
		// ClusterClient resends up to MaxRedirects times), and its first
		// send took the key.
		return lease, nil, 0, nil
	}
	held, basis := parseValue(v)
	age := time.Duration(-1)
	if rem, err := pttl.Result(); err == nil && rem > 0 && basis > 0 && rem <= basis {
		age = basis - rem
	}
	return nil, held, age, ErrNotObtained
}

// tokenLen is the length of an owner token (crypto/rand.Text).
var tokenLen = len(rand.Text())

// unowned starts the value Set writes: a token's length of a byte that
// crypto/rand.Text never yields, so no holder's token ever matches it.
var unowned = strings.Repeat("-", tokenLen)

// withTTL is the part of a value that records the TTL it was given.
func withTTL(ttl time.Duration) string {
	return "|" + strconv.FormatInt(ttl.Milliseconds(), 10) + "|"
}

// parseValue returns the state part of a lease's value and the TTL it
// records, 0 when it records none (a value of an older version).
func parseValue(v string) (state []byte, ttl time.Duration) {
	if len(v) <= tokenLen {
		return nil, 0
	}
	rest := v[tokenLen:]
	if after, ok := strings.CutPrefix(rest, "|"); ok {
		if field, state, ok := strings.Cut(after, "|"); ok {
			if ms, err := strconv.ParseInt(field, 10, 64); err == nil && ms > 0 {
				rest, ttl = state, time.Duration(ms)*time.Millisecond
			}
		}
	}
	if rest == "" {
		return nil, ttl
	}
	return []byte(rest), ttl
}

// Set writes state as the value of (scope, key) for ttl (millisecond
// precision), whoever holds it: the key then holds a lease nobody owns, which
// expires after ttl. It is for a caller that knows the key's state from a
// source of truth (idem writes the copy of an answer stored in PostgreSQL).
//
// Set does not wait for Redis: the write goes out with the Locker's next
// exchange (the next call's or, when no call comes within 10ms, one of its
// own with the writes queued meanwhile), and every call made through the
// Locker after Set returns reaches Redis after it. The ttl counts from the
// call: a write still queued when it has run out is dropped. answered, when not nil, is called once with the write's error
// (nil when it was written or dropped), from a goroutine of the Locker's or
// of the caller whose exchange it rode with, or, for a ttl below 1ms and
// after Shutdown, before Set returns; it must not block. The write is
// bounded by the Locker's Timeout, and so is its wait behind earlier
// exchanges: a write not sent within it is dropped and reported as
// ErrUnavailable.
func (l *Locker) Set(scope, key string, state []byte, ttl time.Duration, answered func(error)) {
	if answered == nil {
		answered = func(error) {}
	}
	if ttl < time.Millisecond {
		answered(fmt.Errorf("lock: set: ttl %v below 1ms", ttl))
		return
	}
	now := time.Now()
	expires, giveUp := now.Add(ttl), now.Add(l.cfg.Timeout)
	v := unowned + withTTL(ttl) + string(state)
	k := l.Key(scope, key)
	l.pipe.later(&call{
		ctx: context.Background(), n: 1, expires: expires, giveUp: giveUp,
		queue: func(ctx context.Context, c redis.Cmdable) redis.Cmder {
			return c.Set(ctx, k, v, max(time.Until(expires), time.Millisecond))
		},
		answered: func(err error) {
			if err != nil {
				err = l.wrap(context.Background(), "set", err)
			}
			answered(err)
		},
	})
}

// Shutdown stops the Locker and sends what it has queued: every call made
// once Shutdown has begun fails with ErrUnavailable without reaching Redis
// (a Set's callback is told so before Set returns), and Shutdown returns
// once every command given before has been answered, the writes of Set
// included, or when ctx ends first, with an error wrapping ctx.Err(); the
// commands still queued then go out as usual, while the client lasts. Call
// it before closing the Redis client, whose closed connections would
// otherwise fail the writes still queued. It is safe to call more than once
// and concurrently with any other method.
func (l *Locker) Shutdown(ctx context.Context) error {
	if err := l.pipe.shutdown(ctx); err != nil {
		return fmt.Errorf("lock: shutdown: %w", err)
	}
	return nil
}

// Delete removes the lease of (scope, key), whoever holds it. Deleting a key
// that holds no lease is not an error.
func (l *Locker) Delete(ctx context.Context, scope, key string) error {
	cctx, cancel := l.callCtx(ctx)
	defer cancel()
	k := l.Key(scope, key)
	if _, err := l.pipe.do(cctx, 1, func(ctx context.Context, c redis.Cmdable) redis.Cmder { return c.Del(ctx, k) }); err != nil {
		return l.wrap(ctx, "delete", err)
	}
	return nil
}

// checkClient refuses the options New refuses, for the client types whose
// options can be read. Options() shows them as go-redis applies them: a
// Client's or a Ring's MaxRetries of 0 reads as 3 and one of -1 as 0, and a
// ClusterClient's 0 reads as -1.
func checkClient(client redis.UniversalClient) error {
	var deadlines bool
	var retries int
	switch c := client.(type) {
	case *redis.Client:
		deadlines, retries = c.Options().ContextTimeoutEnabled, c.Options().MaxRetries
	case *redis.ClusterClient:
		deadlines, retries = c.Options().ContextTimeoutEnabled, c.Options().MaxRetries
	case *redis.Ring:
		deadlines, retries = c.Options().ContextTimeoutEnabled, c.Options().MaxRetries
	default:
		return nil
	}
	switch {
	case !deadlines:
		return errors.New("lock: the redis client must set ContextTimeoutEnabled: true, or go-redis ignores the deadline that enforces Config.Timeout")
	case retries > 0:
		return fmt.Errorf("lock: the redis client must set MaxRetries: -1, not retry %d times (0 means go-redis's default of 3), or a command resent after a lost reply reports the first one's effect as a failure", retries)
	}
	return nil
}

// TryLock is Obtain in the shape idem.Config.Lock takes (idem.Locker). When
// the lease is obtained, it returns a function that replaces the lease's
// state and TTL (0 keeps the remaining life) while the caller still holds it,
// or deletes it when given a nil state; a lease no longer held is left alone,
// and that is not an error. When another caller holds the key, it returns the
// state held, how long ago that value was written or last given a TTL (the
// TTL it was given less its remaining TTL), and a nil function, with a nil
// error.
//
// The age is measured against the TTL the held value records, its writer's:
// Lockers with different Config.TTLs read each other's leases' ages right. It
// is negative when it cannot be told (a value of an older version, which
// records no TTL, or a remaining TTL longer than the one recorded: Redis's
// clock stepped back); idem then reads the row rather than trust the state.
func (l *Locker) TryLock(ctx context.Context, scope, key string, state []byte) (held []byte, age time.Duration, replace func(context.Context, []byte, time.Duration) error, err error) {
	lease, held, age, err := l.obtainOrRead(ctx, scope, key, state)
	switch {
	case errors.Is(err, ErrNotObtained):
		return held, age, nil, nil
	case err != nil:
		return nil, 0, nil, err
	}
	return nil, 0, lease.replaceOrRelease, nil
}

// replaceOrRelease is Replace, or Release when state is nil, with ErrNotHeld
// reported as success.
func (l *Lease) replaceOrRelease(ctx context.Context, state []byte, ttl time.Duration) error {
	var err error
	if state == nil {
		err = l.Release(ctx)
	} else {
		err = l.Replace(ctx, state, ttl)
	}
	if errors.Is(err, ErrNotHeld) {
		return nil
	}
	return err
}

// callCtx bounds one Redis call by the Locker's Timeout.
func (l *Locker) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if l.cfg.Timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, l.cfg.Timeout)
}

// wrap classifies a Redis error. When the caller's own context ended, the
// result wraps ctx.Err() and not ErrUnavailable: Redis was not at fault.
func (l *Locker) wrap(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(err, cerr) { // go-redis returned ctx's own error: say it once
			return fmt.Errorf("lock: %s: %w", op, err)
		}
		return fmt.Errorf("lock: %s: %w: %w", op, cerr, err)
	}
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, op, err)
}

// Lease is a held lock: a key and the random owner token that starts its
// value. Its methods are safe for concurrent use. A Lease says nothing about
// whether Redis still holds it; its methods act only while it does.
type Lease struct {
	locker *Locker
	key    string
	token  string
}

// Release deletes the key if it still holds this lease's token. It returns
// ErrNotHeld when the lease has expired or belongs to someone else now; then
// nothing is deleted.
func (l *Lease) Release(ctx context.Context) error {
	n, err := l.run(ctx, "release", l.token, "", 0, 1)
	if err != nil {
		return err
	}
	if n != 1 {
		return ErrNotHeld
	}
	return nil
}

// Replace sets the lease's state and its remaining life to ttl (millisecond
// precision; 0 keeps the remaining life) if it is still held, else returns
// ErrNotHeld and changes nothing. The lease keeps its token: its holder can
// replace, refresh and release it again.
func (l *Lease) Replace(ctx context.Context, state []byte, ttl time.Duration) error {
	if ttl != 0 && ttl < time.Millisecond {
		return fmt.Errorf("lock: replace: ttl %v below 1ms", ttl)
	}
	n, err := l.run(ctx, "replace", l.token, string(state), ttl.Milliseconds(), 0)
	if err != nil {
		return err
	}
	if n != 1 {
		return ErrNotHeld
	}
	return nil
}

// value is the Redis value of the lease holding state with ttl: its token,
// the TTL, then the state.
func (l *Lease) value(state []byte, ttl time.Duration) string {
	return l.token + withTTL(ttl) + string(state)
}

// run runs replace.lua on the lease's key with args, through the Locker's
// pipeline, and returns its reply: 1 when the lease was still held.
func (l *Lease) run(ctx context.Context, op string, args ...any) (int64, error) {
	cctx, cancel := l.locker.callCtx(ctx)
	defer cancel()
	cmd, err := l.locker.pipe.do(cctx, 1, func(ctx context.Context, c redis.Cmdable) redis.Cmder {
		return l.locker.replace.EvalSha(ctx, c, []string{l.key}, args...)
	})
	if err != nil {
		return 0, l.locker.wrap(ctx, op, err)
	}
	n, ok := cmd.(*redis.Cmd).Val().(int64)
	if !ok {
		return 0, l.locker.wrap(ctx, op, fmt.Errorf("unexpected reply %v", cmd.(*redis.Cmd).Val()))
	}
	return n, nil
}
