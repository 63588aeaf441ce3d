package reconcile

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
)

func TestBackoff(t *testing.T) {
	r := &Reconciler{cfg: settings{BackoffBase: backoffBase, BackoffMax: backoffMax}}
	tests := []struct {
		attempts int
		want     time.Duration
	}{
		{1, 30 * time.Second},
		{2, time.Minute},
		{3, 2 * time.Minute},
		{7, 32 * time.Minute},
		{8, time.Hour},
		{1000, time.Hour},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, r.backoff(tt.attempts), "attempts=%d", tt.attempts)
	}
}

func TestDecisionValidate(t *testing.T) {
	ok := []Decision{
		{},
		{Verdict: NothingHappened},
		{Verdict: Settled, Response: respStatus(201)},
		{Verdict: Settled, Response: respStatus(402)},
	}
	for _, d := range ok {
		require.NoError(t, d.validate(), "%+v", d)
	}
	bad := []Decision{
		{Verdict: Settled},
		{Verdict: Settled, Response: respStatus(429)},
		{Verdict: Settled, Response: respStatus(500)},
		{Verdict: Settled, Response: respStatus(504)},
		{Verdict: Verdict(9)},
		{Verdict: Verdict(-1)},
	}
	for _, d := range bad {
		require.Error(t, d.validate(), "%+v", d)
	}
}

func TestVerdictString(t *testing.T) {
	require.Equal(t, "unknown", Unknown.String())
	require.Equal(t, "settled", Settled.String())
	require.Equal(t, "nothing_happened", NothingHappened.String())
	require.Equal(t, "verdict(7)", Verdict(7).String())
}

func respStatus(s int) idem.Response { return idem.Response{Status: s} }
