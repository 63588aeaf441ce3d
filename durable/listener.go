package durable

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemguard/idem"
)

// channelOf is the notification channel of a table (quoted, qualified name):
// "idem_" and 16 hex digits of its SHA-256, so that every table has its own
// and the name is a valid identifier whatever the schema and table.
func channelOf(table string) string {
	sum := sha256.Sum256([]byte(table))
	return "idem_" + hex.EncodeToString(sum[:8])
}

// keyTag names a key in a notification without revealing it:
// idem.KeyHash, the key_hash of the log lines.
func keyTag(scope, key string) string { return idem.KeyHash(scope, key) }

// Listener wakes the requests that wait for a key's answer (idem's
// Config.Waiter; *Listener implements idem.Waiter). It holds one PostgreSQL
// connection of its own that LISTENs on the table's channel, on which
// stores with Config.Notify announce every key they complete or release, and
// fans the announcements out to the subscribers of each key, however many.
//
// Wake-ups are hints: a subscriber re-reads the key. When the connection is
// lost the Listener reconnects (backing off from 100ms to 5s) and wakes every
// subscriber once it listens again, since announcements made meanwhile were
// missed; a subscriber that is never woken waits out its own timeout.
//
// A Listener is safe for concurrent use. Close stops it.
type Listener struct {
	pool    acquirer
	channel string
	log     *slog.Logger

	mu     sync.Mutex
	subs   map[string]map[*subscription]struct{} // key tag -> subscribers
	closed bool

	stop      context.CancelFunc
	done      chan struct{}
	ready     chan struct{} // closed after the first LISTEN
	readyOnce sync.Once
}

type subscription struct{ ch chan struct{} }

// acquirer hands out a dedicated connection, on which a [Listener] listens.
// *pgxpool.Pool satisfies it.
type acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// NewListener starts listening for the announcements of store's table on a
// connection taken from the store's pool (taken for good: the pool has one
// connection fewer while the Listener runs); the store must run over a
// *pgxpool.Pool. It logs to the store's Config.Logger. It returns once the
// first LISTEN has gone through, so every announcement made after it returns
// reaches the subscribers of its key, or an error (wrapping ctx's) when that
// did not happen before ctx ended.
func NewListener(ctx context.Context, store *Store) (*Listener, error) {
	if store == nil {
		return nil, errors.New("durable: NewListener: nil store")
	}
	pool, ok := store.db.(acquirer)
	if !ok || store.joined {
		return nil, fmt.Errorf("durable: NewListener: the store runs over a %T, not a pool it can take a connection from", store.db)
	}
	runCtx, stop := context.WithCancel(context.Background())
	l := &Listener{
		pool:    pool,
		channel: store.channel,
		log:     store.cfg.Logger,
		subs:    map[string]map[*subscription]struct{}{},
		stop:    stop,
		done:    make(chan struct{}),
		ready:   make(chan struct{}),
	}
	go l.run(runCtx)
	select {
	case <-l.ready:
		return l, nil
	case <-ctx.Done():
		_ = l.Close()
		return nil, fmt.Errorf("durable: listener: not listening yet: %w", ctx.Err())
	}
}

// Subscribe registers interest in the answer of (scope, key). The returned
// channel receives (without blocking the Listener: one queued wake-up is
// kept) whenever the key is announced or announcements may have been missed.
// Call cancel when done; it is safe to call more than once.
func (l *Listener) Subscribe(scope, key string) (wake <-chan struct{}, cancel func()) {
	tag := keyTag(scope, key)
	s := &subscription{ch: make(chan struct{}, 1)}
	l.mu.Lock()
	set := l.subs[tag]
	if set == nil {
		set = map[*subscription]struct{}{}
		l.subs[tag] = set
	}
	set[s] = struct{}{}
	if l.closed {
		s.ch <- struct{}{} // nothing will announce the key any more
	}
	l.mu.Unlock()
	return s.ch, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if set := l.subs[tag]; set != nil {
			delete(set, s)
			if len(set) == 0 {
				delete(l.subs, tag)
			}
		}
	}
}

// Close stops listening, closes the connection and wakes every subscriber.
// Safe to call more than once.
func (l *Listener) Close() error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.stop()
	<-l.done
	l.wake("")
	return nil
}

// wake wakes the subscribers of tag, or every subscriber for "".
func (l *Listener) wake(tag string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	notify := func(set map[*subscription]struct{}) {
		for s := range set {
			select {
			case s.ch <- struct{}{}:
			default: // a wake-up is already queued
			}
		}
	}
	if tag != "" {
		notify(l.subs[tag])
		return
	}
	for _, set := range l.subs {
		notify(set)
	}
}

func (l *Listener) run(ctx context.Context) {
	defer close(l.done)
	pause := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := l.listen(ctx, func() { pause = 100 * time.Millisecond })
		if ctx.Err() != nil {
			return
		}
		l.log.LogAttrs(ctx, slog.LevelWarn, "idem: listener lost its connection; waiters wait out their timeout until it is back",
			slog.String("channel", l.channel), slog.Any("error", err))
		l.wake("")
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		pause = min(2*pause, 5*time.Second)
	}
}

// listen takes a connection, LISTENs and dispatches until it fails or ctx
// ends. listening is called once LISTEN went through.
func (l *Listener) listen(ctx context.Context, listening func()) error {
	pc, err := l.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := pc.Hijack() // a LISTENing connection must not go back to the pool
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.channel}.Sanitize()); err != nil {
		return err
	}
	listening()
	l.wake("") // announcements made before LISTEN were missed
	l.readyOnce.Do(func() { close(l.ready) })
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		l.wake(n.Payload)
	}
}
