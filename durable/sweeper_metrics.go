package durable

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// sweepMetrics are the sweeper's instruments; the zero value records
// nothing.
type sweepMetrics struct {
	enabled  bool
	deleted  metric.Int64Counter
	runs     metric.Int64Counter
	duration metric.Float64Histogram
}

func newSweepMetrics(mp metric.MeterProvider) (sweepMetrics, error) {
	if mp == nil {
		return sweepMetrics{}, nil
	}
	m := mp.Meter("github.com/idemguard/idem/durable")
	var x sweepMetrics
	var err error
	if x.deleted, err = m.Int64Counter("idem.sweep.deleted", metric.WithUnit("{row}"),
		metric.WithDescription("Expired rows the sweeper deleted.")); err != nil {
		return x, err
	}
	if x.runs, err = m.Int64Counter("idem.sweep.runs", metric.WithUnit("{run}"),
		metric.WithDescription("Sweeper runs that held the lease, by outcome.")); err != nil {
		return x, err
	}
	if x.duration, err = m.Float64Histogram("idem.sweep.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of the sweeper's runs that held the lease.")); err != nil {
		return x, err
	}
	x.enabled = true
	return x, nil
}

// record counts one run that held the lease (or failed before it could).
func (x *sweepMetrics) record(ctx context.Context, deleted int64, took time.Duration, outcome string) {
	if !x.enabled {
		return
	}
	ctx = context.WithoutCancel(ctx) // a stopped run is recorded too
	if deleted > 0 {
		x.deleted.Add(ctx, deleted)
	}
	attrs := metric.WithAttributes(attribute.String("outcome", outcome))
	x.runs.Add(ctx, 1, attrs)
	x.duration.Record(ctx, took.Seconds(), attrs)
}
