package durable_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemguard/idem/durable"
)

// The sweeper's metrics come from a MeterProvider, as the Guard's do: rows
// deleted, runs and their duration by outcome.
func TestSweeperMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	b := setup(t, &durable.Config{MeterProvider: mp})
	seedAged(t, b.ctx, b.pool, b.store, "expired", 25, "25 hours")
	sw, _ := newSweeper(t, b, durable.SweeperTuning{BatchSize: 10, BatchPause: -1})
	for range 2 {
		_, err := sw.SweepOnce(b.ctx)
		require.NoError(t, err)
	}

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(b.ctx, &rm))
	sums := map[string]int64{}
	var durations uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					name := m.Name
					if v, ok := p.Attributes.Value("outcome"); ok {
						name += "/" + v.AsString()
					}
					sums[name] += p.Value
				}
			case metricdata.Histogram[float64]:
				require.Equal(t, "idem.sweep.duration", m.Name)
				for _, p := range d.DataPoints {
					durations += p.Count
				}
			}
		}
	}
	require.Equal(t, map[string]int64{"idem.sweep.deleted": 25, "idem.sweep.runs/ok": 2}, sums)
	require.EqualValues(t, 2, durations)
}
