package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/idemguard/idem/durable"
)

// Errors of Complete.
var (
	// ErrNotGuarded: the context does not belong to a guarded execution.
	ErrNotGuarded = errors.New("idem: context does not belong to a guarded execution")
	// ErrJoinUnsupported: the Guard's store cannot write through a caller's
	// transaction (it has no WithDB method returning a *durable.Store).
	ErrJoinUnsupported = errors.New("idem: store cannot join a transaction")
	// ErrSuperseded: another execution of the same intent stored its answer
	// first (possible only where exactly-once was already lost: a hybrid
	// lease that expired or vanished with Redis). Roll back and answer 409:
	// the client's retry is replayed the stored answer.
	ErrSuperseded = errors.New("idem: another execution of this intent stored its answer first")
)

// joiner is implemented by *durable.Store.
type joiner interface {
	WithDB(db durable.DB) *durable.Store
}

// Complete stores resp as the answer of the guarded execution that ctx
// belongs to, through db: typically the pgx.Tx in which the work writes its
// own rows to the same PostgreSQL. The answer then commits or rolls back with
// those rows, so a crash between "order written" and "answer stored" cannot
// happen.
//
// Call it inside the work (or the guarded HTTP handler), before committing db,
// and deliver the same resp to the client (WriteResponse does it for HTTP).
// In the middleware, the response header allowlist applies to what is stored.
// After the work returns, the guard checks that the answer was committed; if
// the transaction rolled back, the work's result is handled as if Complete
// had not been called (a 5xx, for example, leaves the key in progress).
//
// It works in both strategies: in table mode it completes the claimed row, in
// hybrid mode it inserts the finished row under the lease. resp must be a
// storable answer (status 100-499, not 429). Errors: ErrNotGuarded,
// ErrJoinUnsupported, ErrSuperseded (another execution stored its answer
// first), durable errors, or db's own error; on error, roll back.
func Complete(ctx context.Context, db durable.DB, resp Response) error {
	x := executionFrom(ctx)
	if x == nil {
		return ErrNotGuarded
	}
	if disposition(resp, nil) != dispStore {
		return fmt.Errorf("idem: complete: status %d cannot be stored (5xx and 429 never are)", resp.Status)
	}
	j, ok := x.g.store.(joiner)
	if !ok {
		return ErrJoinUnsupported
	}
	a := durable.Answer(resp)
	if x.stored != nil {
		a.Header = captureHeaders(resp.Header, x.stored)
	}
	s := j.WithDB(db)
	var err error
	if x.mode == StrategyHybrid {
		_, err = s.Insert(ctx, durable.ClaimParams{
			Scope: x.req.Scope, Key: x.req.Key, Fingerprint: x.req.Fingerprint, Owner: x.owner,
		}, &a)
	} else {
		err = s.Complete(ctx, x.req.Scope, x.req.Key, x.owner, a)
	}
	if errors.Is(err, durable.ErrExists) || errors.Is(err, durable.ErrNotOwner) || errors.Is(err, durable.ErrCompleted) {
		x.g.log.LogAttrs(ctx, slog.LevelError, "idem: answer stored by another execution of this intent; the work may have run twice",
			slog.String("key_hash", keyHash(x.req)))
		return fmt.Errorf("idem: complete: %w: %w", ErrSuperseded, err)
	}
	if err != nil {
		return fmt.Errorf("idem: complete: %w", err)
	}
	x.joined.Store(true)
	return nil
}

// WriteResponse writes resp to w: its headers, status and body. Guarded HTTP
// handlers that build their answer as a Response (for Complete) use it to
// send exactly what they stored.
func WriteResponse(w http.ResponseWriter, resp Response) {
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	if bodyAllowed(resp.Status) {
		h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	}
	w.WriteHeader(resp.Status)
	if bodyAllowed(resp.Status) {
		_, _ = w.Write(resp.Body)
	}
}
