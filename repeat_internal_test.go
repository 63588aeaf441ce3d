package idem

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRepeatLog(t *testing.T) {
	var r repeatLog
	t0 := time.Now()
	log, held := r.allow("claim: refused", t0)
	require.True(t, log, "the first line of a cause")
	require.Zero(t, held)
	for i := range 5 {
		log, _ = r.allow("claim: refused", t0.Add(time.Duration(i)*time.Second))
		require.False(t, log, "within the interval")
	}
	log, _ = r.allow("claim: timeout", t0.Add(time.Second))
	require.True(t, log, "another cause has its own interval")
	log, held = r.allow("claim: refused", t0.Add(repeatInterval))
	require.True(t, log, "once the interval has passed")
	require.Equal(t, 5, held, "with the count of the lines held back")
	log, _ = r.allow("claim: refused", t0.Add(repeatInterval+time.Second))
	require.False(t, log)

	for i := range maxRepeatCauses {
		r.allow("cause "+strconv.Itoa(i), t0)
	}
	require.LessOrEqual(t, len(r.causes), maxRepeatCauses, "bounded")
	log, _ = r.allow("claim: refused", t0.Add(repeatInterval+2*time.Second))
	require.True(t, log, "a forgotten cause logs again")
}
