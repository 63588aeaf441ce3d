package tempserver_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemguard/idem/internal/tempserver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRedisKillAndRestart(t *testing.T) {
	srv := tempserver.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	require.NoError(t, c.Set(ctx, "k", "v", 0).Err())

	require.NoError(t, srv.Kill())
	require.NoError(t, srv.Kill(), "killing a dead server does nothing")
	require.Error(t, c.Ping(ctx).Err())

	require.NoError(t, srv.Start())
	require.Error(t, srv.Start(), "already running")
	require.Eventually(t, func() bool { return c.Ping(ctx).Err() == nil }, 5*time.Second, 20*time.Millisecond)
	require.ErrorIs(t, c.Get(ctx, "k").Err(), redis.Nil, "a killed Redis without persistence forgets everything")
}

func TestPostgresStopAndStart(t *testing.T) {
	srv := tempserver.StartPostgres(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, srv.URL())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
	require.NoError(t, err)

	require.NoError(t, srv.Stop("immediate"))
	require.NoError(t, srv.Stop("immediate"), "stopping a stopped cluster does nothing")
	require.Error(t, conn.Ping(ctx), "the connection died with the server")
	_ = conn.Close(ctx)

	require.NoError(t, srv.Start())
	conn, err = pgx.Connect(ctx, srv.URL())
	require.NoError(t, err)
	defer conn.Close(ctx)
	var x int
	require.NoError(t, conn.QueryRow(ctx, "SELECT x FROM t").Scan(&x))
	require.Equal(t, 1, x, "data survives a crash and restart")
	require.Equal(t, srv.URL(), srv.URLVia(srv.Addr()))
}
