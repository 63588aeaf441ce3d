package target

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemguard/idem"
)

// MinimalHandler serves next behind the minimal SQL over HTTP, the way the
// guard's middleware serves it behind the store: the request's fingerprint
// (idem.HashRequest of method, target and body), the claim, next's answer
// captured and stored, and for a taken key a 409, a 422 or the stored
// answer replayed (201 with Idempotent-Replayed: true): the least SQL that
// does the job, through the same HTTP path as the guard. In the
// hybrid strategy a SET NX EX comes first, and a refused SET NX reads the
// row (the guard's protocol before the lease carried the key's state).
//
// It has no timeouts, no allowlist of stored headers, no limits beyond a
// 1 MiB body, no logging, no reconciliation: a floor, not a library.
func MinimalHandler(env *Env, strategy string, scope func(*http.Request) string, next http.Handler) (http.Handler, error) {
	if strategy != Table && strategy != Hybrid {
		return nil, fmt.Errorf("unknown strategy %q (want table or hybrid)", strategy)
	}
	m := &minimalHTTP{
		env:    env,
		hybrid: strategy == Hybrid,
		sql:    newMinimalStatements(pgx.Identifier{env.Schema, MinimalTable}.Sanitize()),
		prefix: env.Prefix + "minimal:",
		scope:  scope,
		next:   next,
	}
	return m, nil
}

type minimalHTTP struct {
	env    *Env
	hybrid bool
	sql    minimalStatements
	prefix string
	scope  func(*http.Request) string
	next   http.Handler
	tokens atomic.Uint64
}

func (m *minimalHTTP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key, scope := r.Header.Get(idem.HeaderKey), m.scope(r)
	if key == "" || scope == "" {
		http.Error(w, "missing key or scope", http.StatusBadRequest)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "body", http.StatusBadRequest)
		return
	}
	fp := idem.HashRequest(r.Method, r.URL.RequestURI(), body)
	ctx := r.Context()
	if m.hybrid {
		owner := nextToken(&m.tokens)
		ok, err := m.env.Redis.SetNX(ctx, m.prefix+scope+":"+key, owner[:], 30*time.Second).Result()
		if err != nil {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		if !ok {
			found, err := m.answerTaken(ctx, w, scope, key, fp)
			if err != nil {
				http.Error(w, "unavailable", http.StatusServiceUnavailable)
			}
			if found || err != nil {
				return
			}
		}
	}
	owner := nextToken(&m.tokens)
	var created time.Time
	err = m.env.PGStatements.QueryRow(ctx, m.sql.claim, scope, key, fp[:], owner[:]).Scan(&created)
	claimed := err == nil
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	if err != nil {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	if !claimed {
		found, err := m.answerTaken(ctx, w, scope, key, fp)
		switch {
		case err != nil:
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
		case !found: // rows are never deleted here: not reached
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusConflict)
		}
		return
	}
	rec := &recorder{header: http.Header{}}
	r.Body = io.NopCloser(bytes.NewReader(body))
	m.next.ServeHTTP(rec, r)
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	headers, err := json.Marshal(rec.header)
	if err == nil && rec.status < 500 {
		_, err = m.env.PGStatements.Exec(context.WithoutCancel(ctx), m.sql.complete, scope, key, owner[:],
			int16(rec.status), headers, rec.body.Bytes())
	}
	if err != nil {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	for k, v := range rec.header {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.status)
	_, _ = w.Write(rec.body.Bytes())
}

// answerTaken reads the row of a taken key and answers from it: 422 for
// another fingerprint, 409 while it has no answer, else the answer
// replayed. It reports false when there is no row.
func (m *minimalHTTP) answerTaken(ctx context.Context, w http.ResponseWriter, scope, key string, fp idem.Fingerprint) (bool, error) {
	var (
		hash, headers, body []byte
		status              *int16
	)
	err := m.env.PGStatements.QueryRow(ctx, m.sql.get, scope, key).Scan(&hash, &status, &headers, &body)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, err
	case !bytes.Equal(hash, fp[:]):
		w.WriteHeader(http.StatusUnprocessableEntity)
	case status == nil:
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusConflict)
	default:
		var h http.Header
		if err := json.Unmarshal(headers, &h); err != nil {
			return true, err
		}
		for k, v := range h {
			w.Header()[k] = v
		}
		w.Header().Set(idem.HeaderReplayed, "true")
		w.WriteHeader(int(*status))
		_, _ = w.Write(body)
	}
	return true, nil
}

// recorder captures the answer of the work.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}
func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(p)
}

// nextToken returns a fresh 16-byte owner token from a counter: unique
// within the process, which is all the minimal SQL needs.
func nextToken(n *atomic.Uint64) [16]byte {
	var t [16]byte
	v := n.Add(1)
	for i := range 8 {
		t[i] = byte(v >> (8 * i))
	}
	t[15] = 1
	return t
}
