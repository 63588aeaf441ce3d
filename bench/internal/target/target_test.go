package target

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem/internal/testdb"
	"github.com/idemguard/idem/internal/testredis"
)

func open(t *testing.T) *Env {
	t.Helper()
	testdb.Pool(t) // skips (fails under CI=true) without the servers
	testredis.Client(t)
	env, err := Open(t.Context(), Config{DatabaseURL: testdb.URL(), RedisAddr: testredis.Addr(), PoolSize: 4})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, env.Close(context.Background())) })
	return env
}
