package target

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/lock"
)

// Strategies of the guard.
const (
	Table  = "table"
	Hybrid = "hybrid"
)

// The answer every request's work returns: a 201 with a Location and a small
// JSON body, like the checkout example's.
var (
	answerHeader = http.Header{
		"Content-Type": {"application/json"},
		"Location":     {"/orders/ord_0123456789"},
	}
	answerBody = []byte(`{"id":"ord_0123456789","status":"confirmed","hold_ids":[88211,88212],"amount":4200,"currency":"EUR"}`)
)

// Guard is the real idem.Guard of one strategy in process, its work a sleep.
type Guard struct {
	g    *idem.Guard
	work idem.Work
}

// NewGuardTarget returns the guard of strategy (Table or Hybrid) on env,
// counted by env's counters, whose work sleeps for work.
func NewGuardTarget(env *Env, strategy string, work time.Duration) (*Guard, error) {
	g, err := NewGuard(env.PGStatements, env.Redis, env.Schema, env.Prefix, strategy, false)
	if err != nil {
		return nil, err
	}
	return &Guard{g: g, work: func(ctx context.Context) (idem.Response, error) {
		if err := sleepWork(ctx, work); err != nil {
			return idem.Response{}, err
		}
		return idem.Response{Status: http.StatusCreated, Header: answerHeader, Body: answerBody}, nil
	}}, nil
}

// Do handles req. It returns the idem.Outcome name of what happened
// ("executed", "replayed", "in_progress", "key_reused") and an error only
// when the request failed.
func (t *Guard) Do(ctx context.Context, req idem.Request) (string, error) {
	_, out, err := t.g.Do(ctx, req, t.work)
	switch {
	case errors.Is(err, idem.ErrInProgress), errors.Is(err, idem.ErrKeyReused):
		return out.String(), nil
	case err != nil:
		return out.String(), err
	case out == idem.OutcomeExecutedUnstored:
		return out.String(), errors.New("answer not stored")
	}
	return out.String(), nil
}

func sleepWork(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// NewGuard returns the guard of strategy (Table or Hybrid) that every guard
// of the bench runs, in process or in a worker process: its store on the
// GuardTable of schema through db (with durable.Config.AsynchronousAnswers
// set to asyncAnswers), its Redis lease (hybrid) under prefix + "guard:"
// through rdb, and no logging.
func NewGuard(db durable.DB, rdb redis.UniversalClient, schema, prefix, strategy string, asyncAnswers bool) (*idem.Guard, error) {
	store, err := durable.New(db, &durable.Config{Schema: schema, AsynchronousAnswers: asyncAnswers})
	if err != nil {
		return nil, err
	}
	// Store failures are counted as errors by the bench; the guard's log
	// lines would only garble the progress output.
	cfg := &idem.Config{Logger: slog.New(slog.DiscardHandler)}
	switch strategy {
	case Table:
	case Hybrid:
		l, err := lock.New(rdb, &lock.Config{Prefix: prefix + "guard:"})
		if err != nil {
			return nil, err
		}
		cfg.Lock = l
	default:
		return nil, fmt.Errorf("unknown strategy %q (want table or hybrid)", strategy)
	}
	return idem.New(store, cfg)
}

// Handler is the guarded work served over HTTP: it sleeps for work (or
// until the request ends) and answers what the in-process guard's work
// returns, a 201 with a Location and a small JSON body.
func Handler(work time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := sleepWork(r.Context(), work); err != nil {
			http.Error(w, "cancelled", http.StatusServiceUnavailable)
			return
		}
		for k, v := range answerHeader {
			w.Header()[k] = v
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(answerBody)
	})
}
