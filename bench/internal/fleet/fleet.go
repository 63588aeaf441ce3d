package fleet

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemguard/idem"
)

// Config is what every worker of a fleet is started with.
type Config struct {
	// Binary is the executable re-run as a worker; its main function must
	// call Serve when IsWorker. Defaults to os.Executable().
	Binary      string
	DatabaseURL string
	RedisAddr   string
	// Schema and Prefix are the bench schema (created by the caller) and
	// Redis key prefix the workers share.
	Schema, Prefix string
	Strategy       string // target.Table or target.Hybrid
	// Minimal serves the minimal SQL (target.MinimalHandler), AsyncAnswers
	// sets durable.Config.AsynchronousAnswers, Unshared runs every statement
	// alone (no group commit). Each is passed on only when set, so Binary
	// may be a bench built before the flag existed.
	Minimal, AsyncAnswers, Unshared bool
	// PoolSize is each worker's pgx pool size (MaxConns); RedisPoolSize
	// each worker's go-redis pool size, 0 for go-redis' default.
	PoolSize, RedisPoolSize int
	Work                    time.Duration // the handler's simulated latency
	MaxInFlight             int           // the HTTP client's keep-alive connections per worker
	StartTimeout            time.Duration // how long a worker may take to listen (30s)
	// CPUProfile, when set, is the file each worker writes its CPU profile
	// to, from its start to its exit (a fleet of one worker: they would
	// share it). Passed on only when set, like the flags above.
	CPUProfile string
}

// Fleet is N running worker processes and the HTTP client that drives them.
// Close stops them; it must be called, and is safe to call more than once.
type Fleet struct {
	workers   []*worker
	client    *http.Client
	transport *http.Transport
	closeOnce sync.Once
	closeErr  error
}

type worker struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	base  string // http://host:port
	done  chan struct{}
	err   error       // cmd.Wait's, once done is closed
	log   *tailWriter // its stderr, for diagnosis
}

// Start starts n workers and waits until each listens. On error, the
// workers already started are stopped.
func Start(ctx context.Context, cfg Config, n int) (_ *Fleet, err error) {
	if n < 1 {
		return nil, fmt.Errorf("fleet: %d workers", n)
	}
	if cfg.Binary == "" {
		if cfg.Binary, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("fleet: the bench's executable: %w", err)
		}
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	tr := &http.Transport{
		MaxIdleConns:        n * max(cfg.MaxInFlight, 1),
		MaxIdleConnsPerHost: max(cfg.MaxInFlight, 1),
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}
	f := &Fleet{client: &http.Client{Transport: tr}, transport: tr}
	defer func() {
		if err != nil {
			_ = f.Close()
		}
	}()
	for range n {
		w, err := startWorker(ctx, cfg)
		if w != nil {
			f.workers = append(f.workers, w)
		}
		if err != nil {
			return nil, err
		}
	}
	return f, nil
}

func startWorker(ctx context.Context, cfg Config) (*worker, error) {
	args := []string{
		"-addr", "127.0.0.1:0", "-strategy", cfg.Strategy, "-schema", cfg.Schema, "-prefix", cfg.Prefix,
		"-redis-addr", cfg.RedisAddr, "-pool-size", strconv.Itoa(cfg.PoolSize),
		"-redis-pool-size", strconv.Itoa(cfg.RedisPoolSize), "-work", cfg.Work.String(),
	}
	if cfg.Minimal {
		args = append(args, "-impl", "minimal")
	}
	if cfg.AsyncAnswers {
		args = append(args, "-async-answers")
	}
	if cfg.Unshared {
		args = append(args, "-unshared")
	}
	if cfg.CPUProfile != "" {
		args = append(args, "-cpuprofile", cfg.CPUProfile)
	}
	cmd := exec.Command(cfg.Binary, args...)
	cmd.Env = append(os.Environ(), workerEnv+"=1", databaseEnv+"="+cfg.DatabaseURL)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	w := &worker{cmd: cmd, stdin: stdin, done: make(chan struct{}), log: &tailWriter{max: 4096}}
	cmd.Stderr = w.log
	cmd.WaitDelay = 2 * time.Second // bounds the copy of stderr after exit
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("fleet: starting a worker: %w", err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
				addr <- a
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() {
		w.err = cmd.Wait()
		close(w.done)
	}()
	timer := time.NewTimer(cfg.StartTimeout)
	defer timer.Stop()
	select {
	case a := <-addr:
		w.base = "http://" + a
		return w, nil
	case <-w.done:
		return w, fmt.Errorf("fleet: worker %d exited before listening: %v: %s", cmd.Process.Pid, w.err, w.log)
	case <-timer.C:
		return w, fmt.Errorf("fleet: worker %d did not listen within %v: %s", cmd.Process.Pid, cfg.StartTimeout, w.log)
	case <-ctx.Done():
		return w, ctx.Err()
	}
}

// PIDs returns the workers' process ids (none for a nil Fleet, which
// Meter.Read accepts when the guard runs in process).
func (f *Fleet) PIDs() []int {
	if f == nil {
		return nil
	}
	out := make([]int, len(f.workers))
	for i, w := range f.workers {
		out[i] = w.cmd.Process.Pid
	}
	return out
}

// Close stops every worker (closing its stdin, killing it 3 s later) and
// returns, once all have exited, the errors of those that did not exit
// cleanly.
func (f *Fleet) Close() error {
	f.closeOnce.Do(func() {
		f.transport.CloseIdleConnections()
		for _, w := range f.workers {
			_ = w.stdin.Close()
		}
		deadline := time.NewTimer(3 * time.Second)
		defer deadline.Stop()
		var errs []error
		for _, w := range f.workers {
			select {
			case <-w.done:
			case <-deadline.C:
			}
			select {
			case <-w.done:
			default:
				_ = w.cmd.Process.Kill()
				<-w.done // WaitDelay bounds this
			}
			if w.err != nil {
				errs = append(errs, fmt.Errorf("worker %d: %w: %s", w.cmd.Process.Pid, w.err, w.log))
			}
		}
		f.closeErr = errors.Join(errs...)
	})
	return f.closeErr
}

// outcomeError is the outcome of an answer that is none of the guard's
// decisions.
const outcomeError = "error"

// Post sends POST /orders to worker i with the idempotency key key, the
// scope scope and a body naming the key (so every copy of an intent has the
// same fingerprint), and returns the outcome read from the answer: 201
// executed (replayed with Idempotent-Replayed), 409 in_progress, 422
// key_reused; anything else is an error.
func (f *Fleet) Post(ctx context.Context, i int, key, scope string) (string, error) {
	w := f.workers[i]
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.base+"/orders",
		strings.NewReader(`{"intent":"`+key+`"}`))
	if err != nil {
		return outcomeError, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idem.HeaderKey, key)
	req.Header.Set(ScopeHeader, scope)
	resp, err := f.client.Do(req)
	if err != nil {
		return outcomeError, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	if err != nil {
		return outcomeError, err
	}
	switch resp.StatusCode {
	case http.StatusCreated:
		if resp.Header.Get(idem.HeaderReplayed) == "true" {
			return idem.OutcomeReplayed.String(), nil
		}
		return idem.OutcomeExecuted.String(), nil
	case http.StatusConflict:
		return idem.OutcomeInProgress.String(), nil
	case http.StatusUnprocessableEntity:
		return idem.OutcomeKeyReused.String(), nil
	}
	return outcomeError, fmt.Errorf("worker %d: status %d: %s", w.cmd.Process.Pid, resp.StatusCode, bytes.TrimSpace(body))
}

// FlushStats makes every worker's idle PostgreSQL connections publish their
// statistics (WAL flushes among them) now, not up to 10 s later, so that
// server-wide counters include their work. Call it with nothing in flight.
func (f *Fleet) FlushStats(ctx context.Context) error {
	for _, w := range f.workers {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.base+"/stats", nil)
		if err != nil {
			return err
		}
		resp, err := f.client.Do(req)
		if err != nil {
			return fmt.Errorf("fleet: stats of worker %d: %w", w.cmd.Process.Pid, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("fleet: stats of worker %d: status %d", w.cmd.Process.Pid, resp.StatusCode)
		}
	}
	return nil
}

// tailWriter keeps the last max bytes written to it. Safe for concurrent
// use.
type tailWriter struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = t.buf[len(t.buf)-t.max:]
	}
	return len(p), nil
}

func (t *tailWriter) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.buf))
}
