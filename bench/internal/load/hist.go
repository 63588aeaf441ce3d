// Package load is the open-loop load driver of idem's capacity planner:
// arrivals at fixed intended times ([Run]), the shapes of their keys
// ([Pattern]: unique intents, retry storms, a mix) and latency histograms
// ([Histogram], backed by HdrHistogram).
//
// Latency is measured from each arrival's intended start, not from when a
// worker picked it up, so a system that falls behind is charged for the
// queueing it causes (no coordinated omission).
package load

import (
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Histogram bounds: 1 µs to 5 min, three significant digits (a recorded
// value is off by at most 0.1%).
const (
	histMin     = 1
	histMax     = int64(5 * time.Minute / time.Microsecond)
	histSigFigs = 3
)

// Histogram records durations at microsecond resolution. It is safe for
// concurrent use; the zero value is not usable, call NewHistogram.
type Histogram struct {
	mu sync.Mutex
	h  *hdrhistogram.Histogram
}

// NewHistogram returns an empty histogram of 1 µs to 5 min with three
// significant digits. Longer durations are recorded as 5 min.
func NewHistogram() *Histogram {
	return &Histogram{h: hdrhistogram.New(histMin, histMax, histSigFigs)}
}

// Record adds one duration.
func (h *Histogram) Record(d time.Duration) {
	us := d.Microseconds()
	if us < histMin {
		us = histMin
	}
	if us > histMax {
		us = histMax
	}
	h.mu.Lock()
	_ = h.h.RecordValue(us) // in range by construction
	h.mu.Unlock()
}

// Count returns the number of recorded durations.
func (h *Histogram) Count() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.h.TotalCount()
}

// Quantile returns the duration at quantile q, 0 < q <= 1 (0.99 for p99), or
// 0 when nothing was recorded.
func (h *Histogram) Quantile(q float64) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return time.Duration(h.h.ValueAtQuantile(q*100)) * time.Microsecond
}

// Max returns the largest recorded duration (to the histogram's precision).
func (h *Histogram) Max() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return time.Duration(h.h.Max()) * time.Microsecond
}

// Mean returns the mean of the recorded durations.
func (h *Histogram) Mean() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return time.Duration(h.h.Mean() * float64(time.Microsecond))
}

// Merge adds every duration recorded in other to h.
func (h *Histogram) Merge(other *Histogram) {
	snap := func() *hdrhistogram.Histogram {
		other.mu.Lock()
		defer other.mu.Unlock()
		return hdrhistogram.Import(other.h.Export())
	}()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.h.Merge(snap)
}
