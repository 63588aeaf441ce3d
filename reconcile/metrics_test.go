package reconcile_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/reconcile"
)

// The reconciler's metrics go to the Guard's MeterProvider, beside the
// Guard's own: keys by result, runs and their duration by outcome.
func TestMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	b := setup(t, "table")
	var err error
	b.guard, err = idem.New(b.store, &idem.Config{Logger: quiet(), WorkTimeout: 10 * time.Second, MeterProvider: mp})
	require.NoError(t, err)
	settled, unknown := request(newKey()), request(newKey())
	b.timedOut(t, settled)
	b.timedOut(t, unknown)
	b.age(t, settled.Scope, settled.Key, "2 minutes")
	b.age(t, unknown.Scope, unknown.Key, "2 minutes")
	b.res.set(func(_ context.Context, it reconcile.Item) (reconcile.Decision, error) {
		if it.Key == settled.Key {
			return reconcile.Decision{Verdict: reconcile.Settled, Response: created("o1")}, nil
		}
		return reconcile.Decision{}, nil
	})
	r := b.reconciler(t, nil)
	require.Equal(t, reconcile.Result{Settled: 1, Unknown: 1}, b.runOnce(t, r))
	require.Equal(t, reconcile.Result{}, b.runOnce(t, r))

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(b.ctx, &rm))
	keys, runs := map[string]int64{}, map[string]int64{}
	var durations uint64
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != "github.com/idemguard/idem/reconcile" {
			continue // the Guard's own
		}
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					switch m.Name {
					case "idem.reconcile.keys":
						v, _ := p.Attributes.Value("result")
						keys[v.AsString()] += p.Value
					case "idem.reconcile.runs":
						v, _ := p.Attributes.Value("outcome")
						runs[v.AsString()] += p.Value
					default:
						t.Errorf("unexpected counter %s", m.Name)
					}
				}
			case metricdata.Histogram[float64]:
				require.Equal(t, "idem.reconcile.duration", m.Name)
				for _, p := range d.DataPoints {
					durations += p.Count
				}
			}
		}
	}
	require.Equal(t, map[string]int64{"settled": 1, "unknown": 1}, keys)
	require.Equal(t, map[string]int64{"ok": 2}, runs)
	require.EqualValues(t, 2, durations)
}
