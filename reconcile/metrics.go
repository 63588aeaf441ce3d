package reconcile

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// metrics are the reconciler's instruments; the zero value records nothing.
type metrics struct {
	enabled  bool
	keys     metric.Int64Counter
	runs     metric.Int64Counter
	duration metric.Float64Histogram
}

func newMetrics(mp metric.MeterProvider) (metrics, error) {
	if mp == nil {
		return metrics{}, nil
	}
	m := mp.Meter("github.com/idemguard/idem/reconcile")
	var x metrics
	var err error
	if x.keys, err = m.Int64Counter("idem.reconcile.keys", metric.WithUnit("{key}"),
		metric.WithDescription("Keys the reconciler handled, by result.")); err != nil {
		return x, err
	}
	if x.runs, err = m.Int64Counter("idem.reconcile.runs", metric.WithUnit("{run}"),
		metric.WithDescription("Reconciler runs that held the lease, by outcome.")); err != nil {
		return x, err
	}
	if x.duration, err = m.Float64Histogram("idem.reconcile.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of the reconciler's runs that held the lease.")); err != nil {
		return x, err
	}
	x.enabled = true
	return x, nil
}

// record counts one run that held the lease (or failed before it could).
func (x *metrics) record(ctx context.Context, res Result, took time.Duration, outcome string) {
	if !x.enabled {
		return
	}
	ctx = context.WithoutCancel(ctx) // a stopped run is recorded too
	for _, k := range []struct {
		result string
		n      int
	}{
		{"settled", res.Settled}, {"released", res.Released}, {"unknown", res.Unknown},
		{"skipped", res.Skipped}, {"error", res.Errors},
	} {
		if k.n > 0 {
			x.keys.Add(ctx, int64(k.n), metric.WithAttributes(attribute.String("result", k.result)))
		}
	}
	x.runs.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", outcome)))
	x.duration.Record(ctx, took.Seconds(), metric.WithAttributes(attribute.String("outcome", outcome)))
}
