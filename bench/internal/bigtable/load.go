package bigtable

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Row n of a batch tagged tag has the key md5(tag:n) written as a uuid, the
// scope user-<n % 1e6>, and is in progress when n % 100 == 0; the rest carry
// a 201 answer. keyOf and scopeOf compute the same in Go, so that the replay
// can pick existing answered keys.
const (
	users          = 1_000_000
	inProgressMod  = 100
	liveTag        = "live"
	expiredTagBase = "expired"
)

// loadSQL inserts rows $1 <= n < $2 of batch $3, created $4 µs plus a
// uniformly random share of $5 µs before now().
const loadSQL = `
INSERT INTO {t} (user_id, key, request_hash, owner_token, response_status,
	response_headers, response_body, created_at, completed_at)
SELECT 'user-' || (g % 1000000), k,
	sha256(convert_to('req:' || k, 'UTF8')),
	decode(md5('own:' || k), 'hex'),
	CASE WHEN open THEN NULL ELSE 201 END,
	CASE WHEN open THEN NULL ELSE jsonb_build_object(
		'Location', jsonb_build_array('/payments/' || k),
		'Content-Type', jsonb_build_array('application/json')) END,
	CASE WHEN open THEN NULL ELSE convert_to(
		'{"id":"' || k || '","object":"payment","status":"succeeded","amount":' || (g % 100000) ||
		',"currency":"eur","customer":"user-' || (g % 1000000) || '","description":"order ' || g ||
		'","receipt":"' || md5('r' || k) || md5('s' || k) || md5('t' || k) || '"}', 'UTF8') END,
	at,
	CASE WHEN open THEN NULL ELSE at + interval '200 milliseconds' END
FROM (
	-- A row in progress never expires (migration 0005): the expired
	-- batches are all answered.
	SELECT g, md5($3 || ':' || g)::uuid::text AS k, g % 100 = 0 AND $3 NOT LIKE 'expired%' AS open,
		now() - ($4::bigint + random() * $5::bigint) * interval '1 microsecond' AS at
	FROM generate_series($1::bigint, $2::bigint - 1) AS g
) AS s`

// keyOf is the key of row n of batch tag, as loadSQL writes it.
func keyOf(tag string, n int64) string {
	sum := md5.Sum([]byte(tag + ":" + strconv.FormatInt(n, 10)))
	h := hex.EncodeToString(sum[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// scopeOf is the user_id of row n.
func scopeOf(n int64) string { return "user-" + strconv.FormatInt(n%users, 10) }

// answered reports whether loadSQL gave row n an answer.
func answered(n int64) bool { return n%inProgressMod != 0 }

// batch is a range of rows to load.
type batch struct {
	tag      string
	from, to int64         // rows from <= n < to
	age      time.Duration // created_at is now() - age - random share of spread
	spread   time.Duration
}

// load inserts b in chunks of chunk rows on workers connections at once and
// returns how long it took.
func load(ctx context.Context, pool *pgxpool.Pool, table string, b batch, chunk int64, workers int) (time.Duration, error) {
	start := time.Now()
	sql := strings.ReplaceAll(loadSQL, "{t}", table)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	chunks := make(chan int64)
	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Go(func() {
			for lo := range chunks {
				hi := min(lo+chunk, b.to)
				if _, err := pool.Exec(ctx, sql, lo, hi, b.tag, b.age.Microseconds(), b.spread.Microseconds()); err != nil {
					cancel(fmt.Errorf("load rows %d..%d of %s: %w", lo, hi, b.tag, err))
				}
			}
		})
	}
feed:
	for lo := b.from; lo < b.to; lo += chunk {
		select {
		case chunks <- lo:
		case <-ctx.Done():
			break feed
		}
	}
	close(chunks)
	wg.Wait()
	return time.Since(start), context.Cause(ctx)
}
