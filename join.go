package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
)

// Complete stores resp as the answer of the guarded execution that ctx
// belongs to, through tx: typically the pgx.Tx in which the work writes its
// own rows to the same PostgreSQL. The answer then commits or rolls back with
// those rows, so a crash between "order written" and "answer stored" cannot
// happen.
//
// Call it inside the work (or the guarded HTTP handler), commit tx before the
// work returns, and deliver the same resp to the client (Response.Write does
// it for HTTP; a gRPC handler passes grpcidem.Answer's form of its reply). In the middleware, the response header allowlist applies to
// what is stored. After the work returns, the guard reads the key's row:
//
//   - committed: the key is answered, whatever the work returned: Do
//     returns the completed answer (and the middleware and grpcidem's
//     interceptor send it), as every retry replays it, even when the work
//     returned or wrote another, such as a 500 after a commit whose reply
//     was lost; such a mismatch is logged and counted ("answer_mismatch");
//   - rolled back: the answer is never stored, and the key stays in
//     progress until it is settled (or is released, after MarkRetrySafe).
//
// It works in both strategies: the execution's claimed row is completed,
// owner-checked, in the caller's transaction. resp must be a storable answer
// (status 100-499, not 429). The Guard's store must be a [Joiner] that can
// write through tx (for *durable.Store: a durable.DB, such as a pgx.Tx).
// Errors: ErrNotGuarded, ErrJoinUnsupported, ErrSuperseded, the store's
// errors, or tx's own error; on error, roll back.
func Complete(ctx context.Context, tx any, resp Response) error {
	x := executionFrom(ctx)
	if x == nil {
		return ErrNotGuarded
	}
	if disposition(resp, nil) != dispStore {
		return fmt.Errorf("idem: complete: status %d cannot be stored (5xx and 429 never are)", resp.Status)
	}
	j, ok := x.g.store.(Joiner)
	if !ok {
		return ErrJoinUnsupported
	}
	joined, err := j.Join(tx)
	if err != nil {
		return &wrapError{op: "complete", cause: err}
	}
	a := resp
	if x.stored != nil {
		a.Header = captureHeaders(resp.Header, x.stored)
	}
	err = joined.Complete(ctx, x.req.Scope, x.req.Key, x.owner, a)
	if errors.Is(err, ErrNotOwner) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrCompleted) {
		x.g.log.LogAttrs(ctx, slog.LevelError, "idem: the key no longer takes this execution's answer",
			slog.String("key_hash", keyHash(x.req)), slog.Any("error", err))
		return &wrapError{kind: ErrSuperseded, cause: err}
	}
	if err != nil {
		return &wrapError{op: "complete", cause: err}
	}
	x.joined.Store(&a)
	return nil
}

// Write writes resp to w: its headers, status and body. Guarded HTTP
// handlers that build their answer as a Response (for Complete) use it to
// send exactly what they stored.
func (resp Response) Write(w http.ResponseWriter) {
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
