package bigtable

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
)

// Operations measured, as named in the report.
const (
	OpClaimNew    = "claim (new key)"
	OpComplete    = "complete (fresh claim)"
	OpReplayClaim = "claim (replay of an answered key)"
	OpReplayGet   = "get (replay of an answered key)"
)

// Latency summarises the samples of one operation.
type Latency struct {
	Samples, Errors int
	P50, P99, Max   time.Duration
	FirstError      string
}

// recorder collects the latencies of several operations from several
// goroutines.
type recorder struct {
	mu   sync.Mutex
	ops  map[string][]time.Duration
	errs map[string]int
	msg  map[string]string
}

func newRecorder() *recorder {
	return &recorder{ops: map[string][]time.Duration{}, errs: map[string]int{}, msg: map[string]string{}}
}

func (r *recorder) add(op string, d time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.errs[op]++
		if r.msg[op] == "" {
			r.msg[op] = err.Error()
		}
		return
	}
	r.ops[op] = append(r.ops[op], d)
}

// timed runs f and records its latency under op.
func (r *recorder) timed(op string, f func() error) error {
	start := time.Now()
	err := f()
	r.add(op, time.Since(start), err)
	return err
}

func (r *recorder) latency(op string) Latency {
	r.mu.Lock()
	defer r.mu.Unlock()
	return summarize(r.ops[op], r.errs[op], r.msg[op])
}

// summarize returns the nearest-rank percentiles of d.
func summarize(d []time.Duration, errs int, msg string) Latency {
	l := Latency{Samples: len(d), Errors: errs, FirstError: msg}
	if len(d) == 0 {
		return l
	}
	s := slices.Clone(d)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	l.P50, l.P99, l.Max = rank(0.50), rank(0.99), s[len(s)-1]
	return l
}

// client issues the measured operations through the real store.
type client struct {
	store *durable.Store
	live  int64 // rows 0 <= n < live of the live batch exist
}

// newKey returns a fresh scope and key, never loaded.
func newKey(rng *rand.Rand) (scope, key string) {
	a, b := rng.Uint64(), rng.Uint64()
	h := fmt.Sprintf("%016x%016x", a, b)
	return "user-" + strconv.Itoa(rng.IntN(users)), h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// answer is what Complete stores: a 201 with a Location and a body of about
// 300 bytes, like the loaded rows.
func answer(scope, key string) idem.Response {
	sum := sha256.Sum256([]byte(key))
	body := fmt.Sprintf(`{"id":"%s","object":"payment","status":"succeeded","amount":4200,"currency":"eur","customer":"%s","description":"order","receipt":"%x%x"}`,
		key, scope, sum, sum[:16])
	return idem.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Location": {"/payments/" + key}, "Content-Type": {"application/json"}},
		Body:   []byte(body),
	}
}

// claimAndComplete claims a new key, then completes it, timing each.
func (c *client) claimAndComplete(ctx context.Context, rng *rand.Rand, rec *recorder) {
	scope, key := newKey(rng)
	var owner idem.Token
	putUint64s(owner[:], rng.Uint64(), rng.Uint64()|1)
	p := idem.ClaimParams{Scope: scope, Key: key, Owner: owner, Fingerprint: sha256.Sum256([]byte("req:" + key))}
	err := rec.timed(OpClaimNew, func() error {
		_, claimed, err := c.store.Claim(ctx, p)
		if err == nil && !claimed {
			err = errors.New("a new key was not claimed")
		}
		return err
	})
	if err != nil {
		return
	}
	_ = rec.timed(OpComplete, func() error { return c.store.Complete(ctx, scope, key, owner, answer(scope, key)) })
}

// answeredRow picks a random answered row of the live batch.
func (c *client) answeredRow(rng *rand.Rand) int64 {
	for {
		if n := rng.Int64N(c.live); answered(n) {
			return n
		}
	}
}

// replayClaim claims an answered key again: the claim must lose and return
// the stored answer.
func (c *client) replayClaim(ctx context.Context, rng *rand.Rand, rec *recorder) {
	n := c.answeredRow(rng)
	key := keyOf(liveTag, n)
	var owner idem.Token
	putUint64s(owner[:], rng.Uint64(), rng.Uint64()|1)
	p := idem.ClaimParams{Scope: scopeOf(n), Key: key, Owner: owner, Fingerprint: sha256.Sum256([]byte("req:" + key))}
	_ = rec.timed(OpReplayClaim, func() error {
		r, claimed, err := c.store.Claim(ctx, p)
		switch {
		case err != nil:
			return err
		case claimed:
			return fmt.Errorf("row %d: an answered key was claimed again", n)
		case r.Answer == nil || r.Answer.Status != http.StatusCreated:
			return fmt.Errorf("row %d: replay without its 201 answer", n)
		}
		return nil
	})
}

// replayGet reads an answered key.
func (c *client) replayGet(ctx context.Context, rng *rand.Rand, rec *recorder) {
	n := c.answeredRow(rng)
	_ = rec.timed(OpReplayGet, func() error {
		r, err := c.store.Get(ctx, scopeOf(n), keyOf(liveTag, n))
		if err == nil && r.Answer == nil {
			err = fmt.Errorf("row %d: no answer", n)
		}
		return err
	})
}

func putUint64s(b []byte, a, c uint64) {
	for i := range 8 {
		b[i] = byte(a >> (8 * i))
		b[8+i] = byte(c >> (8 * i))
	}
}

// fanOut runs f samples times in all on conc goroutines, each with its own
// random source, and stops early when ctx ends.
func fanOut(ctx context.Context, conc, samples int, seed uint64, f func(rng *rand.Rand)) {
	var wg sync.WaitGroup
	for w := range conc {
		share := samples / conc
		if w < samples%conc {
			share++
		}
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for range share {
				if ctx.Err() != nil {
					return
				}
				f(rng)
			}
		})
	}
	wg.Wait()
}
