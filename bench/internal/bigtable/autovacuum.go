package bigtable

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// autovacuumSwitch turns the server's autovacuum on with ALTER SYSTEM and
// restores the previous state: the postgresql.auto.conf entry it replaced,
// or none. Restore is safe to call more than once and from a signal handler
// goroutine.
type autovacuumSwitch struct {
	pool    *pgxpool.Pool
	log     io.Writer
	restore func() error // set by enable; runs once
	sigs    chan os.Signal
}

// enableAutovacuum turns autovacuum on for the whole server until the
// returned switch's Restore. Until then, SIGINT and SIGTERM restore the
// setting first (the run's context is cancelled by the caller's own handler);
// a second signal exits with status 130 after restoring.
func enableAutovacuum(ctx context.Context, pool *pgxpool.Pool, log io.Writer) (*autovacuumSwitch, error) {
	// An earlier ALTER SYSTEM entry, if any, is what to put back.
	var prev string
	err := pool.QueryRow(ctx, `
SELECT setting FROM pg_file_settings
WHERE name = 'autovacuum' AND sourcefile LIKE '%postgresql.auto.conf'
ORDER BY seqno DESC LIMIT 1`).Scan(&prev)
	hadEntry := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("read postgresql.auto.conf: %w", err)
	}
	undo := "ALTER SYSTEM RESET autovacuum"
	if hadEntry {
		undo = "ALTER SYSTEM SET autovacuum = " + quoteLiteral(prev)
	}
	sw := &autovacuumSwitch{pool: pool, log: log, sigs: make(chan os.Signal, 2)}
	var once sync.Once
	var onceErr error
	sw.restore = func() error {
		once.Do(func() {
			signal.Stop(sw.sigs)
			rctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			if _, err := pool.Exec(rctx, undo); err != nil {
				onceErr = fmt.Errorf("restore autovacuum (%s; SELECT pg_reload_conf()): %w", undo, err)
				return
			}
			if _, err := pool.Exec(rctx, "SELECT pg_reload_conf()"); err != nil {
				onceErr = fmt.Errorf("restore autovacuum: pg_reload_conf: %w", err)
				return
			}
			fmt.Fprintf(log, "autovacuum restored: %s; SELECT pg_reload_conf()\n", undo)
		})
		return onceErr
	}

	signal.Notify(sw.sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		n := 0
		for range sw.sigs {
			n++
			_ = sw.restore()
			if n >= 2 {
				os.Exit(130)
			}
		}
	}()
	fmt.Fprintf(log, "autovacuum on for the run; if this process is killed, restore it with: %s; SELECT pg_reload_conf();\n", undo)
	if _, err := pool.Exec(ctx, "ALTER SYSTEM SET autovacuum = on"); err != nil {
		_ = sw.restore()
		return nil, fmt.Errorf("ALTER SYSTEM SET autovacuum = on: %w", err)
	}
	if _, err := pool.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return sw, fmt.Errorf("pg_reload_conf: %w", err)
	}
	// The reload is asynchronous: wait until a backend sees it.
	for range 50 {
		var v string
		if err := pool.QueryRow(ctx, "SHOW autovacuum").Scan(&v); err != nil {
			return sw, err
		}
		if v == "on" {
			return sw, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return sw, errors.New("autovacuum still off 5s after pg_reload_conf()")
}

// Restore puts the previous autovacuum setting back and reloads the
// configuration.
func (sw *autovacuumSwitch) Restore() error { return sw.restore() }

func quoteLiteral(s string) string {
	out := []byte{'\''}
	for i := range len(s) {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}
