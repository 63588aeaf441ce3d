package plan

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/bench/internal/load"
)

func valid() Config {
	return Config{
		Step: time.Second, Rates: []float64{100, 200}, MaxInFlight: 8, StormK: 5, Dup: 0.2,
		StormWindow: 20 * time.Millisecond, Scenarios: []string{Unique, Storm, Mix}, Strategies: []string{"table", "hybrid"},
	}
}

func TestValidate(t *testing.T) {
	c := valid()
	require.NoError(t, c.validate())
	for name, mutate := range map[string]func(*Config){
		"step":      func(c *Config) { c.Step = 0 },
		"no rates":  func(c *Config) { c.Rates = nil },
		"unsorted":  func(c *Config) { c.Rates = []float64{200, 100} },
		"inflight":  func(c *Config) { c.MaxInFlight = 0 },
		"k":         func(c *Config) { c.StormK = 1 },
		"dup":       func(c *Config) { c.Dup = 1 },
		"scenario":  func(c *Config) { c.Scenarios = []string{"burst"} },
		"strategy":  func(c *Config) { c.Strategies = []string{"redis"} },
		"no strats": func(c *Config) { c.Strategies = nil },
		"noise":     func(c *Config) { c.NoiseRuns = -1 },
	} {
		c := valid()
		mutate(&c)
		require.Error(t, c.validate(), name)
	}
}

func TestPatternAndImpls(t *testing.T) {
	c := valid()
	require.Zero(t, c.pattern(Unique, 1000).DupShare())
	require.InDelta(t, 0.8, c.pattern(Storm, 1000).DupShare(), 1e-9)
	require.InDelta(t, 0.2, c.pattern(Mix, 1000).DupShare(), 1e-9)
	require.Equal(t, []string{"guard", "ceiling", "minimal"}, c.impls())
	c.NoMinimal = true
	require.Equal(t, []string{"guard", "ceiling"}, c.impls())
	c.NoCeiling = true
	require.Equal(t, []string{"guard"}, c.impls())
	c.NoMinimal = false
	require.Equal(t, []string{"guard", "minimal"}, c.impls())
}

func TestAlternate(t *testing.T) {
	require.Equal(t, []int{0, 1, 2}, alternate(3, 0))
	require.Equal(t, []int{2, 1, 0}, alternate(3, 1))
	require.Equal(t, []int{0, 1, 2}, alternate(3, 2))
	require.Empty(t, alternate(0, 1))
}

type recorder []idem.Request

func (r *recorder) Do(_ context.Context, req idem.Request) (string, error) {
	*r = append(*r, req)
	return "executed", nil
}
func (r *recorder) Table() string { return "t" }

// TestOpKeys: retries of an intent carry its key and fingerprint; other
// intents and other steps get other keys.
func TestOpKeys(t *testing.T) {
	var rec recorder
	o := op(&rec, load.Storm(3, time.Millisecond, 10), 7)
	for i := range int64(6) {
		_, err := o(t.Context(), i)
		require.NoError(t, err)
	}
	require.Equal(t, rec[0], rec[1])
	require.Equal(t, rec[0], rec[2])
	require.NotEqual(t, rec[0].Key, rec[3].Key)
	require.NotEqual(t, rec[0].Fingerprint, rec[3].Fingerprint)
	require.Equal(t, "s7-0", rec[0].Key)

	var rec2 recorder
	_, _ = op(&rec2, load.Unique(), 8)(t.Context(), 0)
	require.NotEqual(t, rec[0].Key, rec2[0].Key)
}
