package load

import (
	"fmt"
	"math"
	"time"
)

// Arrival says which intent an arrival carries: Intent identifies the
// request (same Intent, same idempotency key and same body) and Copy is 0 for
// the first request of the intent and 1, 2, ... for its retries.
type Arrival struct {
	Intent int64
	Copy   int
}

// A Pattern maps the index of an arrival in a step (0, 1, 2, ...) to the
// intent it carries. Patterns are pure functions of the index, so the same
// step always sends the same keys in the same order.
type Pattern interface {
	// At returns the intent of arrival i (i >= 0).
	At(i int64) Arrival
	// DupShare is the share of arrivals that are retries (Copy > 0) over a
	// long step.
	DupShare() float64
	// String describes the pattern for reports, e.g. "storm K=5 in 20ms".
	String() string
}

// Unique returns the pattern where every arrival is a new intent.
func Unique() Pattern { return unique{} }

type unique struct{}

func (unique) At(i int64) Arrival { return Arrival{Intent: i} }
func (unique) DupShare() float64  { return 0 }
func (unique) String() string     { return "unique keys" }

// Storm returns the pattern where every intent is sent k times (k >= 2), its
// copies spread evenly over window at the given arrival rate, as clients
// retrying a timeout would. Arrivals of different intents interleave: with
// stride s = round(window*rate/(k-1)) (at least 1), the copies of an intent
// are s arrivals apart.
func Storm(k int, window time.Duration, rate float64) Pattern {
	if k < 2 {
		k = 2
	}
	s := int64(math.Round(window.Seconds() * rate / float64(k-1)))
	if s < 1 {
		s = 1
	}
	return storm{k: int64(k), stride: s, window: window}
}

type storm struct {
	k, stride int64
	window    time.Duration
}

func (p storm) At(i int64) Arrival {
	block := p.stride * p.k
	b := i % block
	return Arrival{Intent: (i/block)*p.stride + b%p.stride, Copy: int(b / p.stride)}
}

func (p storm) DupShare() float64 { return float64(p.k-1) / float64(p.k) }

func (p storm) String() string {
	return fmt.Sprintf("storm K=%d in %v", p.k, p.window)
}

// stormBit separates the intents of a Mix's storm stream from those of its
// unique stream.
const stormBit = int64(1) << 62

// Mix returns the pattern where a share dup of all arrivals are retries: a
// share dup*k/(k-1) of the arrivals (spread evenly, Bresenham-style) form a
// Storm(k, window) stream and the rest are unique intents. dup is clamped to
// [0, (k-1)/k].
func Mix(dup float64, k int, window time.Duration, rate float64) Pattern {
	if k < 2 {
		k = 2
	}
	maxDup := float64(k-1) / float64(k)
	dup = math.Max(0, math.Min(dup, maxDup))
	p := dup * float64(k) / float64(k-1)
	return mix{p: p, dup: dup, storm: Storm(k, window, rate*p).(storm)}
}

type mix struct {
	p, dup float64
	storm  storm
}

// stormBefore returns how many of the arrivals 0..i-1 belong to the storm
// stream.
func (m mix) stormBefore(i int64) int64 { return int64(math.Floor(float64(i) * m.p)) }

func (m mix) At(i int64) Arrival {
	j := m.stormBefore(i)
	if m.stormBefore(i+1) > j {
		a := m.storm.At(j)
		a.Intent |= stormBit
		return a
	}
	return Arrival{Intent: i - j}
}

func (m mix) DupShare() float64 { return m.dup }

func (m mix) String() string {
	return fmt.Sprintf("mix: %.0f%% retries, K=%d in %v", 100*m.dup, m.storm.k, m.storm.window)
}
