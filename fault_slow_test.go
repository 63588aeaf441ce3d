package idem_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/durable"
	"github.com/idemguard/idem/internal/faultproxy"
	"github.com/idemguard/idem/internal/heavy"
	"github.com/idemguard/idem/internal/testdb"
)

// PostgreSQL slows down (300 ms added to every round trip) under a steady
// 80 new orders per second, on a pool of 4 connections shared with the
// handler's own transaction, as in the checkout example. During the fault,
// requests that find no connection free within AdmissionWait are refused
// with 503 at once; once it ends, new orders are served again within 5 s
// (no backlog of requests queued for their whole StoreTimeout keeps every
// connection busy after it). Every order runs at most once.
//
// IDEM_FAULT_SLOW_FOR sets the fault's length (default 4s; the figure in
// docs/reliability.md is for 30s).
func TestFaultPostgresSlow(t *testing.T) {
	heavy.Gate(t) // the fault suite: seconds of load
	faultFor := 4 * time.Second
	if v := os.Getenv("IDEM_FAULT_SLOW_FOR"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err)
		faultFor = d
	}
	admin, dbcfg := sharedPG(t)
	dbcfg.AdmissionWait = 0 // the default: what this test is about
	u, err := url.Parse(testdb.URL())
	require.NoError(t, err)
	proxy := faultproxy.Start(t, u.Host)
	u.Host = proxy.Addr()
	pcfg, err := pgxpool.ParseConfig(u.String())
	require.NoError(t, err)
	pcfg.MaxConns = 4 // pgxpool's default on 2 cores
	pcfg.ConnConfig.ConnectTimeout = time.Second
	pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	orders := pgx.Identifier{dbcfg.Schema, "orders"}.Sanitize()
	_, err = admin.Exec(t.Context(), "CREATE TABLE "+orders+" (key text PRIMARY KEY)")
	require.NoError(t, err)

	store, err := durable.New(pool, dbcfg)
	require.NoError(t, err)
	g, err := idem.New(store, &idem.Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)

	// The handler writes its order and the answer in one transaction.
	var runs sync.Map // key -> *atomic.Int32
	work := func(ctx context.Context) (idem.Response, error) {
		rq := idem.ExecutionFromContext(ctx).Request
		n, _ := runs.LoadOrStore(rq.Key, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		resp := created(rq.Key)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO "+orders+" (key) VALUES ($1)", rq.Key); err != nil {
				return err
			}
			return idem.Complete(ctx, tx, resp)
		})
		if err != nil {
			return idem.Response{Status: 500}, err
		}
		return resp, nil
	}

	type result struct {
		start time.Time
		out   idem.Outcome
		err   error
	}
	const rate = 80 // new orders per second, open loop
	var (
		mu      sync.Mutex
		results []result
		wg      sync.WaitGroup
	)
	began := time.Now()
	faultAt, faultEnd := began.Add(time.Second), began.Add(time.Second+faultFor)
	stop := faultEnd.Add(8 * time.Second)
	go func() {
		time.Sleep(time.Until(faultAt))
		proxy.SetLatency(150 * time.Millisecond) // each way
		time.Sleep(time.Until(faultEnd))
		proxy.SetLatency(0)
	}()
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	for i := 0; time.Now().Before(stop); i++ {
		<-tick.C
		wg.Go(func() {
			start := time.Now()
			_, out, err := g.Do(context.Background(), req("u", fmt.Sprintf("slow-%d", i), "order"), work)
			mu.Lock()
			results = append(results, result{start, out, err})
			mu.Unlock()
		})
	}
	wg.Wait()

	// Recovered: from the fault's end to the first new order served, as the
	// rest of the fault suite counts it; and the share of the orders of the
	// next seconds that ran.
	sort.Slice(results, func(i, j int) bool { return results[i].start.Before(results[j].start) })
	recovered := time.Duration(-1)
	var after, ranAfter, refusedDuring int
	for _, r := range results {
		switch {
		case r.start.After(faultAt) && r.start.Before(faultEnd) && r.out == idem.OutcomeNone:
			refusedDuring++
		case r.start.After(faultEnd):
			after++
			if r.out == idem.OutcomeExecuted {
				ranAfter++
				if recovered < 0 {
					recovered = r.start.Sub(faultEnd)
				}
			}
		}
	}
	runs.Range(func(k, v any) bool {
		require.LessOrEqual(t, v.(*atomic.Int32).Load(), int32(1), "order %s ran twice", k)
		return true
	})
	t.Logf("RELIABILITY scenario=postgres-slow-%v strategy=table rate=%d/s pool=4 orders=%d refused_during_fault=%d recovered_in=%v ran_after=%d/%d",
		faultFor, rate, len(results), refusedDuring, recovered.Round(time.Millisecond), ranAfter, after)
	require.GreaterOrEqual(t, recovered, time.Duration(0), "no new order served after the fault")
	require.Less(t, recovered, 5*time.Second, "new orders served within 5 s of the fault's end")
}
