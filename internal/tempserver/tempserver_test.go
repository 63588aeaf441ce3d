package tempserver_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemguard/idem/internal/tempserver"
	"github.com/idemguard/idem/internal/testredis"
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

// Six nodes, three masters: a master killed with SIGKILL is replaced by its
// replica, keeping what reached the replica, and comes back as a replica of
// it when restarted.
func TestRedisClusterFailover(t *testing.T) {
	start := time.Now()
	cl := tempserver.StartRedisCluster(t)
	t.Logf("cluster ready in %v", time.Since(start).Round(time.Millisecond))
	ctx := context.Background()
	require.Len(t, cl.Nodes(), 6)
	require.Len(t, cl.Addrs(), 6)
	c := testredis.Cluster(t, cl.Addrs())

	masters, err := cl.Masters(ctx)
	require.NoError(t, err)
	require.Len(t, masters, 3)
	roles := map[string]int{}
	for _, n := range cl.Nodes() {
		role, err := n.Role(ctx)
		require.NoError(t, err)
		roles[role]++
	}
	require.Equal(t, map[string]int{"master": 3, "replica": 3}, roles)

	// Keys on every master; each is found on the master MasterOf names.
	keysOf := map[*tempserver.Redis][]string{}
	for i := 0; len(keysOf) < 3 || i < 30; i++ {
		key := fmt.Sprint("key-", i)
		require.NoError(t, c.Set(ctx, key, key, 0).Err())
		m, err := cl.MasterOf(ctx, key)
		require.NoError(t, err)
		require.Contains(t, masters, m)
		keysOf[m] = append(keysOf[m], key)
		direct := redis.NewClient(&redis.Options{Addr: m.Addr()})
		require.Equal(t, key, direct.Get(ctx, key).Val(), "the key lives on the master of its slot")
		require.NoError(t, direct.Close())
	}

	victim := masters[1]
	replica, err := cl.ReplicaOf(ctx, victim)
	require.NoError(t, err)
	require.NotContains(t, masters, replica)
	direct := redis.NewClient(&redis.Options{Addr: victim.Addr()})
	defer direct.Close()
	// WAIT: every write so far has reached the replica.
	require.EqualValues(t, 1, direct.Do(ctx, "WAIT", 1, 2000).Val())
	resume, err := replica.CutReplication(ctx)
	require.NoError(t, err)
	// Acknowledged by the master, never replicated.
	lost := keysOf[victim][0]
	require.NoError(t, c.Set(ctx, lost, "overwritten", 0).Err())
	require.Zero(t, direct.Do(ctx, "WAIT", 1, 100).Val(), "the replica is cut off")

	require.NoError(t, victim.Kill())
	killed := time.Now()
	require.False(t, victim.Running())
	require.NoError(t, cl.WaitReady(15*time.Second))
	t.Logf("replica promoted in %v", time.Since(killed).Round(time.Millisecond))
	require.NoError(t, resume(ctx))
	after, err := cl.Masters(ctx)
	require.NoError(t, err)
	require.Len(t, after, 3)
	require.NotContains(t, after, victim)
	require.Contains(t, after, replica)
	promoted, err := cl.MasterOf(ctx, lost)
	require.NoError(t, err)
	require.Equal(t, replica, promoted, "the victim's replica serves its slots")
	require.Eventually(t, func() bool { return c.Get(ctx, lost).Err() == nil }, 5*time.Second, 50*time.Millisecond)
	for _, key := range keysOf[victim] {
		require.Equal(t, key, c.Get(ctx, key).Val(), "replicated before the kill, so kept; the later write is lost")
	}

	require.NoError(t, victim.Start())
	require.NoError(t, cl.WaitReady(15*time.Second))
	role, err := victim.Role(ctx)
	require.NoError(t, err)
	require.Equal(t, "replica", role, "a restarted master rejoins as a replica of its successor")
	t.Logf("all done in %v", time.Since(start).Round(time.Millisecond))
}

// A synchronous standby has every acknowledged commit of its primary, even
// with its replay paused; after the primary is killed it is promoted and
// serves them, and takes writes.
func TestPostgresStandbyPromoted(t *testing.T) {
	primary := tempserver.StartPostgres(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, primary.URL())
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE TABLE t (x int)")
	require.NoError(t, err)

	standby := primary.StartStandby(t, "standby1")
	require.NotEqual(t, primary.Addr(), standby.Addr())
	_, err = conn.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = 'standby1'")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SELECT pg_reload_conf()")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var state string
		err := conn.QueryRow(ctx, "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1'").Scan(&state)
		return err == nil && state == "sync"
	}, 10*time.Second, 20*time.Millisecond, "the standby connects under its name and is synchronous")

	sconn, err := pgx.Connect(ctx, standby.URL())
	require.NoError(t, err)
	_, err = sconn.Exec(ctx, "SELECT pg_wal_replay_pause()")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "INSERT INTO t VALUES (1)") // acknowledged once the standby has flushed it
	require.NoError(t, err)
	require.NoError(t, sconn.Close(ctx))

	require.NoError(t, primary.Kill())
	_, err = conn.Exec(ctx, "INSERT INTO t VALUES (3)")
	require.Error(t, err, "no backend serves a statement sent once Kill has returned")
	require.NoError(t, primary.Kill(), "killing a dead server does nothing")

	require.NoError(t, standby.Promote())
	sconn, err = pgx.Connect(ctx, standby.URL())
	require.NoError(t, err)
	defer sconn.Close(ctx)
	var n int
	require.NoError(t, sconn.QueryRow(ctx, "SELECT count(*) FROM t WHERE x = 1").Scan(&n))
	require.Equal(t, 1, n, "the acknowledged row was replayed at the promotion")
	_, err = sconn.Exec(ctx, "INSERT INTO t VALUES (2)")
	require.NoError(t, err, "the promoted standby takes writes")
}
