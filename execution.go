package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"
)

// executionKey is the context key under which the work's context carries
// its execution.
type executionKey struct{}

func executionFrom(ctx context.Context) *execution {
	x, _ := ctx.Value(executionKey{}).(*execution)
	return x
}

// execution is one run of the work under a claimed durable row: one attempt
// of the row's intent. Its owner token is the row's, for this attempt only.
type execution struct {
	g         *Guard
	req       Request
	owner     Token       // the attempt's: the owner checks compare it
	intent    Token       // the row's intent, kept across releases
	attempt   int         // which attempt of the intent: 1, 2, ...
	expires   time.Time   // when the claimed row expires in the store, on the local monotonic clock
	claimed   time.Time   // when the work started, right after the claim (local clock): its deadline counts from here
	retrySafe atomic.Bool // MarkRetrySafe was called

	// joined is the answer Complete wrote through the caller's transaction;
	// whether that transaction committed is checked after the work.
	joined atomic.Pointer[Response]
	stored []string // middleware: the header allowlist, applied by Complete
}

type disp int

const (
	dispStore    disp = iota // a final answer: store it
	dispUnstored             // unknown: leave the key in progress
	dispRelease              // nothing happened: release the key
)

func disposition(resp Response, err error) disp {
	switch {
	case errors.Is(err, ErrRetrySafe):
		return dispRelease
	case err != nil:
		return dispUnstored
	case resp.Status == http.StatusTooManyRequests:
		return dispRelease
	case resp.Status < 100 || resp.Status >= 500:
		return dispUnstored
	}
	return dispStore
}

// overrunGrace is how long after its deadline work may return and still be
// within MaxHold: a context-respecting handler needs a moment to unwind.
const overrunGrace = time.Second

// run runs the work under the claim, with a context that carries the
// execution and ends WorkTimeout from now, and records what it answered.
func (x *execution) run(ctx context.Context, work Work) (Response, Outcome, error) {
	// The caller's cancellation (a client hanging up) does not reach the
	// work: a charge in flight finishes and its answer is stored, instead
	// of ending as an unknown outcome that waits for reconciliation. The
	// work keeps the caller's values and ends WorkTimeout after the claim.
	x.claimed = time.Now()
	wctx, cancel := context.WithDeadline(context.WithValue(context.WithoutCancel(ctx), executionKey{}, x), x.claimed.Add(x.g.workTimeout))
	returned := false
	defer func() {
		if !returned {
			cancel()
			x.panicked(ctx)
		}
	}()
	resp, err := work(wctx)
	returned = true
	cancel()
	return x.finish(ctx, resp, err)
}

// panicked leaves the key in progress: the panic may have come after a side
// effect. Only a work that said MarkRetrySafe first gets its key released.
func (x *execution) panicked(ctx context.Context) {
	if x.retrySafe.Load() {
		x.release(ctx)
		x.g.tel.add(ctx, evReleased)
		return
	}
	x.g.tel.add(ctx, evUnstored)
	x.g.log.LogAttrs(ctx, slog.LevelError, "idem: work panicked; the key stays in progress until it is settled or released",
		slog.String("key_hash", keyHash(x.req)))
}

// finish records what the work answered, once it has returned.
func (x *execution) finish(ctx context.Context, resp Response, err error) (Response, Outcome, error) {
	if took := time.Since(x.claimed); took > x.g.workTimeout+overrunGrace {
		x.g.tel.add(ctx, evOverrun)
		x.g.log.LogAttrs(ctx, slog.LevelError, "idem: work ran past its deadline; a reconciler may have acted on its key meanwhile",
			slog.String("key_hash", keyHash(x.req)), slog.Duration("took", took), slog.Duration("work_timeout", x.g.workTimeout))
	}
	d := disposition(resp, err)
	if x.retrySafe.Load() {
		d = dispRelease
	}
	if a := x.joined.Load(); a != nil {
		return x.finishJoined(ctx, resp, err, *a, d)
	}
	switch d {
	case dispRelease:
		x.release(ctx)
		x.g.tel.add(ctx, evReleased)
		return resp, OutcomeExecutedReleased, err
	case dispUnstored:
		x.g.tel.add(ctx, evUnstored)
		if err == nil && (resp.Status < 100 || resp.Status >= 600) {
			err = fmt.Errorf("idem: work returned invalid status %d", resp.Status)
		}
		return resp, OutcomeExecutedUnstored, err
	}
	if werr := x.write(ctx, resp); werr != nil {
		x.g.tel.add(ctx, evUnstored)
		if errors.Is(werr, ErrInvalid) {
			// The answer cannot be stored as it is (a header value that
			// is not UTF-8): say so to the caller, not only to the log.
			return resp, OutcomeExecutedUnstored, fmt.Errorf("idem: the answer cannot be stored: %w", werr)
		}
		return resp, OutcomeExecutedUnstored, nil
	}
	x.answered(ctx, resp)
	return resp, OutcomeExecuted, nil
}

// answered counts an answer stored on the claimed row and keeps it where
// retries look first: the local cache and, in the hybrid, the lease.
func (x *execution) answered(ctx context.Context, a Response) {
	x.g.tel.add(ctx, evExecuted)
	if x.g.traces != nil {
		x.g.traces.executed(ctx, keyHash(x.req))
	}
	x.g.remember(x.req, a, x.expires)
	if x.g.lock != nil {
		x.g.copyAnswer(ctx, x.req, x.req.Fingerprint, a, x.expires)
	}
}

// finishJoined decides after work that called Complete: the answer counts
// only if the caller's transaction committed it. A rolled-back answer is
// never stored: the work's effects rolled back with it, or not, and only a
// reconciler can tell, so the key stays in progress (or is released if the
// work said nothing happened).
func (x *execution) finishJoined(ctx context.Context, resp Response, err error, joined Response, d disp) (Response, Outcome, error) {
	sctx, cancel := x.g.storeContext(ctx)
	rec, gerr := x.g.store.Get(sctx, x.req.Scope, x.req.Key)
	cancel()
	switch {
	case gerr == nil && rec.Owner == x.owner && rec.Answer != nil:
		if !joined.Equal(resp) {
			x.g.tel.add(ctx, evAnswerMismatch)
			x.g.log.LogAttrs(ctx, slog.LevelError, "idem: the work returned an answer other than the one it completed; retries are replayed the completed one",
				slog.String("key_hash", keyHash(x.req)), slog.Int("completed_status", joined.Status), slog.Int("returned_status", resp.Status))
		}
		x.answered(ctx, *rec.Answer)
		// The caller gets the answer its retries get: the stored one, even
		// when the work returned another (say a 500 after a commit whose
		// reply was lost).
		return *rec.Answer, OutcomeExecuted, err
	case gerr == nil && rec.Owner == x.owner:
		// The caller's transaction rolled back.
		if d == dispRelease {
			x.release(ctx)
			x.g.tel.add(ctx, evReleased)
			return resp, OutcomeExecutedReleased, err
		}
		x.g.tel.add(ctx, evUnstored)
		x.g.log.LogAttrs(ctx, slog.LevelWarn, "idem: the transaction that completed the answer did not commit; the key stays in progress until it is settled",
			slog.String("key_hash", keyHash(x.req)), slog.Int("status", resp.Status))
		return resp, OutcomeExecutedUnstored, err
	case gerr == nil || errors.Is(gerr, ErrNotFound):
		x.takenOver(ctx, "read joined answer")
	default:
		// Cannot tell whether the caller's transaction committed: the key
		// stays in progress rather than risk a second execution.
		x.storeFailed(ctx, "read joined answer", gerr)
	}
	x.g.tel.add(ctx, evUnstored)
	return resp, OutcomeExecutedUnstored, err
}

// Writes of an answer after the work are tried storeAttempts times, with
// these pauses between tries, each bounded by StoreTimeout.
const storeAttempts = 3

var storeRetryPause = [storeAttempts - 1]time.Duration{100 * time.Millisecond, 400 * time.Millisecond}

func storeRetryPauses() (d time.Duration) {
	for _, p := range storeRetryPause {
		d += p
	}
	return d
}

// write stores the answer on the claimed row, owner-checked. A write whose
// reply was lost is retried, and the store reports a retry that finds the
// same answer already written by the same owner as success. A failure leaves
// the key in progress; it is logged here.
func (x *execution) write(ctx context.Context, a Response) error {
	var err error
	for i := range storeAttempts {
		if i > 0 {
			time.Sleep(storeRetryPause[i-1]) // the caller's cancellation does not stop the answer being stored
		}
		sctx, cancel := x.g.storeContext(ctx)
		t0 := x.g.tel.start()
		err = x.g.store.Complete(sctx, x.req.Scope, x.req.Key, x.owner, a)
		x.g.tel.since(ctx, phaseStore, t0)
		cancel()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, ErrNotOwner), errors.Is(err, ErrNotFound), errors.Is(err, ErrCompleted):
			x.takenOver(ctx, "complete")
			return err
		case errors.Is(err, ErrInvalid):
			x.storeFailed(ctx, "complete", err)
			return err
		}
	}
	x.storeFailed(ctx, "complete", err)
	return err
}

// takenOver reports that the claimed row is no longer this execution's: it
// was released or settled (and perhaps claimed again) while the work ran,
// which only work that overran MaxHold, or a hand-made release or settle,
// allows. A row in progress never expires.
func (x *execution) takenOver(ctx context.Context, op string) {
	x.g.tel.add(ctx, evDoubleExecution)
	x.g.log.LogAttrs(ctx, slog.LevelError, "idem: the claimed row was released, settled or taken over while the work ran; the work may have run twice",
		slog.String("op", op), slog.String("key_hash", keyHash(x.req)))
}

func (x *execution) storeFailed(ctx context.Context, op string, err error) {
	x.g.tel.add(ctx, evStoreError)
	x.g.log.LogAttrs(ctx, slog.LevelError, "idem: answer not stored; the key stays in progress until settled or released",
		slog.String("op", op), slog.String("key_hash", keyHash(x.req)), slog.Any("error", err))
}

// release marks the claimed row released (nothing happened: the next retry
// runs, as the next attempt of the same intent) and, in hybrid mode, deletes
// the key's lease, so that the retry is not refused from it.
func (x *execution) release(ctx context.Context) {
	sctx, cancel := x.g.storeContext(ctx)
	err := x.g.store.Release(sctx, x.req.Scope, x.req.Key, x.owner)
	cancel()
	if err != nil {
		x.g.tel.add(ctx, evStoreError)
		x.g.log.LogAttrs(ctx, slog.LevelError, "idem: releasing the claim failed; the key stays in progress until settled or released",
			slog.String("key_hash", keyHash(x.req)), slog.Any("error", err))
		return
	}
	if x.g.lock != nil {
		x.g.dropLease(ctx, x.req)
	}
}
