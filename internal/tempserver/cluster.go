package tempserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idem/internal/heavy"
)

// ClusterNodeTimeout is the cluster-node-timeout of a RedisCluster: a master
// that has not answered its peers for this long is marked failed and its
// replica takes over, typically within two to three times this.
const ClusterNodeTimeout = time.Second

// RedisCluster is a Redis Cluster of six redis-server processes on
// 127.0.0.1, three masters and one replica of each, owned by a test. Its
// methods are safe for concurrent use.
//
// Replication is asynchronous, as in production: a write acknowledged by a
// master that is killed before the write reached its replica is lost when
// the replica takes over.
type RedisCluster struct {
	nodes []*Redis
}

// StartRedisCluster starts six redis-server processes in cluster mode (each
// on two free ports of 127.0.0.1, one for clients and one for the cluster
// bus, without persistence; the cluster configuration file lives in the
// node's temporary directory, so a node restarted with Start rejoins as the
// same node), joins them with redis-cli --cluster create --cluster-replicas 1,
// and returns once WaitReady succeeds. Every node is killed when tb ends.
//
// It needs redis-server 7.0 or newer (for cluster-port) and redis-cli from
// PATH; without them tb is skipped, or fails under CI=true. It is a heavy
// test's (internal/heavy): tb is skipped unless those run.
func StartRedisCluster(tb testing.TB) *RedisCluster {
	tb.Helper()
	heavy.Gate(tb)
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		missing(tb, "redis-server", "install it (apt-get install redis-server)")
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		missing(tb, "redis-cli", "install it (apt-get install redis-tools)")
	}
	if v := serverMajor(bin); v < 7 {
		missing(tb, "redis-server 7.0 or newer", fmt.Sprintf("%s is version %d; install a newer one", bin, v))
	}
	c := &RedisCluster{}
	for range 6 {
		n, err := startClusterNode(tb, bin)
		if err != nil {
			tb.Fatalf("tempserver: start cluster node: %v", err)
		}
		c.nodes = append(c.nodes, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		tb.Fatalf("tempserver: redis-cli --cluster create: %v\n%s", err, tail(out, 2000))
	}
	if err := c.WaitReady(20 * time.Second); err != nil {
		tb.Fatalf("tempserver: %v\n%s", err, c.logs())
	}
	return c
}

// startClusterNode starts one node, retrying with other ports when one of
// the two it picked was taken meanwhile.
func startClusterNode(tb testing.TB, bin string) (*Redis, error) {
	dir := tb.TempDir()
	r := &Redis{tb: tb, bin: bin, dir: dir, log: filepath.Join(dir, "redis.log")}
	var last error
	for range 3 {
		port, err1 := freePort()
		bus, err2 := freePort()
		if last = errors.Join(err1, err2); last != nil || port == bus {
			continue
		}
		r.port = port
		r.args = []string{
			"--cluster-enabled", "yes",
			"--cluster-port", strconv.Itoa(bus),
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", strconv.FormatInt(ClusterNodeTimeout.Milliseconds(), 10),
			// A replica takes over however long it has been cut off from its
			// master: failover is what the tests want to see.
			"--cluster-replica-validity-factor", "0",
			// A replica syncs at once rather than waiting for others to join
			// the same transfer (5s by default).
			"--repl-diskless-sync-delay", "0",
			"--loglevel", "notice", // failovers are logged at this level
		}
		if last = r.Start(); last == nil {
			break
		}
	}
	if last != nil {
		return nil, last
	}
	tb.Cleanup(func() { _ = r.Kill() })
	return r, nil
}

// serverMajor returns the major version of the redis-server at bin, or 0.
func serverMajor(bin string) int {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return 0
	}
	m := regexp.MustCompile(`v=(\d+)\.`).FindSubmatch(out)
	if m == nil {
		return 0
	}
	v, _ := strconv.Atoi(string(m[1]))
	return v
}

// Nodes returns the six nodes in the order they were created. Which of them
// are masters changes with failovers: ask Masters or MasterOf.
func (c *RedisCluster) Nodes() []*Redis { return append([]*Redis(nil), c.nodes...) }

// Addrs returns host:port of every node, the seed list for
// redis.ClusterOptions.Addrs.
func (c *RedisCluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.Addr()
	}
	return out
}

// Running reports whether the node's process is running (not killed).
func (r *Redis) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cmd != nil
}

// Node returns the node listening on addr, or nil.
func (c *RedisCluster) Node(addr string) *Redis {
	for _, n := range c.nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// Masters returns the nodes that serve slots, as the first running node sees
// the cluster, ordered by their first slot.
func (c *RedisCluster) Masters(ctx context.Context) ([]*Redis, error) {
	slots, err := c.slots(ctx)
	if err != nil {
		return nil, err
	}
	var out []*Redis
	seen := map[*Redis]bool{}
	for _, s := range slots {
		n := c.Node(s.Nodes[0].Addr)
		if n == nil {
			return nil, fmt.Errorf("tempserver: slots %d-%d served by unknown node %s", s.Start, s.End, s.Nodes[0].Addr)
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out, nil
}

// MasterOf returns the master that serves key's hash slot (CLUSTER KEYSLOT,
// then CLUSTER SLOTS), as the first running node sees the cluster.
func (c *RedisCluster) MasterOf(ctx context.Context, key string) (*Redis, error) {
	var slot int64
	err := c.onAnyNode(ctx, func(cl *redis.Client) (err error) {
		slot, err = cl.ClusterKeySlot(ctx, key).Result()
		return err
	})
	if err != nil {
		return nil, err
	}
	slots, err := c.slots(ctx)
	if err != nil {
		return nil, err
	}
	for _, s := range slots {
		if int64(s.Start) <= slot && slot <= int64(s.End) {
			if n := c.Node(s.Nodes[0].Addr); n != nil {
				return n, nil
			}
			return nil, fmt.Errorf("tempserver: slot %d served by unknown node %s", slot, s.Nodes[0].Addr)
		}
	}
	return nil, fmt.Errorf("tempserver: no node serves slot %d", slot)
}

func (c *RedisCluster) slots(ctx context.Context) ([]redis.ClusterSlot, error) {
	var slots []redis.ClusterSlot
	err := c.onAnyNode(ctx, func(cl *redis.Client) (err error) {
		slots, err = cl.ClusterSlots(ctx).Result() //lint:ignore SA1019 CLUSTER SLOTS still answers on Redis 7 and 8; its ranges are what these checks compare
		return err
	})
	sort.Slice(slots, func(i, j int) bool { return slots[i].Start < slots[j].Start })
	return slots, err
}

// onAnyNode runs fn with a client of the first running node that answers.
func (c *RedisCluster) onAnyNode(ctx context.Context, fn func(*redis.Client) error) error {
	var errs []error
	for _, n := range c.nodes {
		if !n.Running() {
			continue
		}
		err := withClient(n.Addr(), fn)
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", n.Addr(), err))
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return errors.New("tempserver: no cluster node is running")
	}
	return errors.Join(errs...)
}

// withClient runs fn with a client of the single node at addr (no
// redirections, no retries), closed afterwards.
func withClient(addr string, fn func(*redis.Client) error) error {
	cl := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 500 * time.Millisecond,
		DialerRetries: 1, ReadTimeout: time.Second, WriteTimeout: time.Second, PoolSize: 1})
	defer cl.Close()
	return fn(cl)
}

// WaitReady waits up to d until the cluster serves every slot from a running
// master: every running node reports cluster_state:ok and sees each slot
// served by a running node, and every running replica's link to its master
// is up. After Kill of a master this is the moment its replica has taken
// over (and every node knows it); after Start of a killed node, the moment it
// has rejoined and synced.
func (c *RedisCluster) WaitReady(d time.Duration) error {
	if err := waitFor(d, c.ready); err != nil {
		return fmt.Errorf("tempserver: redis cluster not ready after %v: %w", d, err)
	}
	return nil
}

func (c *RedisCluster) ready() error {
	ctx := context.Background()
	var first, firstAddr string
	for _, n := range c.nodes {
		if !n.Running() {
			continue
		}
		var view string
		err := withClient(n.Addr(), func(cl *redis.Client) error {
			info, err := cl.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return errors.New("cluster_state is not ok")
			}
			slots, err := cl.ClusterSlots(ctx).Result() //lint:ignore SA1019 as in slots
			if err != nil {
				return err
			}
			covered := 0
			for _, s := range slots {
				m := c.Node(s.Nodes[0].Addr)
				if m == nil || !m.Running() {
					return fmt.Errorf("slots %d-%d served by %s, which is down", s.Start, s.End, s.Nodes[0].Addr)
				}
				covered += s.End - s.Start + 1
			}
			if covered != 16384 {
				return fmt.Errorf("%d of 16384 slots served", covered)
			}
			view = slotView(slots)
			repl, err := cl.Info(ctx, "replication").Result()
			if err != nil {
				return err
			}
			if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
				return errors.New("replica not in sync with its master")
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("node %s: %w", n.Addr(), err)
		}
		if first == "" {
			first, firstAddr = view, n.Addr()
		} else if view != first {
			return fmt.Errorf("nodes %s and %s disagree about the slots: %s vs %s", firstAddr, n.Addr(), first, view)
		}
	}
	return nil
}

// slotView is the slot ranges and their masters, in a comparable form.
func slotView(slots []redis.ClusterSlot) string {
	parts := make([]string, len(slots))
	for i, s := range slots {
		parts[i] = fmt.Sprintf("%d-%d:%s", s.Start, s.End, s.Nodes[0].Addr)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// ReplicaOf returns a replica of master, as master reports it (ROLE).
func (c *RedisCluster) ReplicaOf(ctx context.Context, master *Redis) (*Redis, error) {
	var addr string
	err := withClient(master.Addr(), func(cl *redis.Client) error {
		v, err := cl.Do(ctx, "ROLE").Slice()
		if err != nil {
			return err
		}
		if len(v) < 3 || v[0] != "master" {
			return fmt.Errorf("not a master: ROLE %v", v)
		}
		replicas, _ := v[2].([]any)
		if len(replicas) == 0 {
			return errors.New("master has no replica")
		}
		r, _ := replicas[0].([]any)
		if len(r) < 2 {
			return fmt.Errorf("unexpected ROLE reply %v", v)
		}
		addr = net.JoinHostPort(fmt.Sprint(r[0]), fmt.Sprint(r[1]))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("tempserver: replica of %s: %w", master.Addr(), err)
	}
	n := c.Node(addr)
	if n == nil {
		return nil, fmt.Errorf("tempserver: replica of %s is unknown node %s", master.Addr(), addr)
	}
	return n, nil
}

// CutReplication breaks the link of the replica r to its master and keeps
// it from syncing again (its masterauth is set to a password the master
// rejects) until resume is called: what the master acknowledges meanwhile
// does not reach r, and is lost if the master dies and r takes over. This is
// asynchronous replication's window, widened from microseconds to as long
// as the test wants. Cluster gossip is not affected: r still takes over
// when its master fails.
func (r *Redis) CutReplication(ctx context.Context) (resume func(context.Context) error, err error) {
	err = withClient(r.Addr(), func(cl *redis.Client) error {
		if err := cl.ConfigSet(ctx, "masterauth", "tempserver-cut").Err(); err != nil {
			return err
		}
		return cl.Do(ctx, "CLIENT", "KILL", "TYPE", "master").Err()
	})
	if err == nil {
		err = waitFor(5*time.Second, func() error {
			return withClient(r.Addr(), func(cl *redis.Client) error {
				repl, err := cl.Info(ctx, "replication").Result()
				if err != nil {
					return err
				}
				if strings.Contains(repl, "master_link_status:up") {
					return errors.New("replication link still up")
				}
				return nil
			})
		})
	}
	if err != nil {
		return nil, fmt.Errorf("tempserver: cut replication to %s: %w", r.Addr(), err)
	}
	return func(ctx context.Context) error {
		return withClient(r.Addr(), func(cl *redis.Client) error {
			return cl.ConfigSet(ctx, "masterauth", "").Err()
		})
	}, nil
}

// Role returns "master" or "replica": the node's role as it reports it.
func (r *Redis) Role(ctx context.Context) (string, error) {
	var role string
	err := withClient(r.Addr(), func(cl *redis.Client) error {
		v, err := cl.Do(ctx, "ROLE").Slice()
		if err != nil {
			return err
		}
		if len(v) == 0 {
			return errors.New("empty ROLE reply")
		}
		role, _ = v[0].(string)
		return nil
	})
	if role == "slave" {
		role = "replica"
	}
	return role, err
}

// logs returns the end of every node's log, for a failure message.
func (c *RedisCluster) logs() string {
	var b strings.Builder
	for _, n := range c.nodes {
		out, _ := readTail(n.log, 1500)
		fmt.Fprintf(&b, "--- %s (running=%v)\n%s\n", n.Addr(), n.Running(), out)
	}
	return b.String()
}
