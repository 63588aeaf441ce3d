// Package idemclient is the client half of idem's protocol over net/http: an
// [http.RoundTripper] that sends every attempt of one request with the same
// Idempotency-Key and the same body, and retries what the server says may be
// retried, so that a timeout or a dropped connection never turns into a
// second order.
//
//	client := &http.Client{Transport: idemclient.New(nil, nil)}
//	req, _ := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(body))
//	req.Header.Set(idem.HeaderKey, intent.Key) // born with the buyer's click; or leave it out
//	resp, err := client.Do(req)
//	res := idemclient.ResultOf(resp)            // res.Key, res.Replayed, res.Attempts
//
// # What is retried
//
// A request is guarded when its method is POST or PATCH or it carries an
// Idempotency-Key header; others pass through to the base RoundTripper once,
// untouched. A guarded request without a key gets a new random one (NewKey),
// drawn once and sent with every attempt. Its body is read once, up to
// Config.MaxBody, and every attempt sends exactly those bytes.
//
//	Answer                                              Retried
//	no answer: connection refused, reset, dropped       yes
//	409 request-in-progress, 409 request-pending        yes, after its Retry-After
//	429, any 5xx (503 service-unavailable included)     yes, after its Retry-After if any
//	a replay (Idempotent-Replayed: true), any status    no: it is the stored answer
//	422 idempotency-key-reused, any other 4xx, 2xx, 3xx no
//
// The wait before a retry is the server's Retry-After (seconds or an HTTP
// date), never shortened; without one it is a capped exponential backoff
// with full jitter (Retry). The retries end at the first of: a final answer,
// Retry.MaxAttempts, Retry.MaxElapsed (then the last answer is returned,
// or, after a transport error, an *Error), and the request's context (an
// *Error wrapping its error). A retry that would start after the context's
// deadline is not waited for: RoundTrip returns at once with an *Error
// wrapping context.DeadlineExceeded. A 409 is recognised by its problem
// type (application/problem+json whose type ends in the slug), whatever the
// server's problem base.
//
// WARNING: a key the Transport draws lives as long as one RoundTrip. After an
// *Error the request may have run: send it again with Error.Key, never as a
// new request without a key, which would be a second order. Better, draw the
// key when the intent is born and keep it with the intent.
package idemclient

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemguard/idem"
	"github.com/idemguard/idem/internal/retry"
)

// Retry bounds and paces the retries of one request. The zero Retry gives
// every default; a negative field makes New panic, naming it.
type Retry struct {
	// MaxAttempts is how many attempts are sent in all, the first
	// included; 1 sends no retry. Defaults to 5.
	MaxAttempts int
	// MaxElapsed is the longest time from the first attempt to the start
	// of the last: a retry that would start later is not sent. Defaults to
	// 30s, so a request-pending answer (Retry-After 30s or more, while the
	// key waits for reconciliation) ends the retries at once.
	MaxElapsed time.Duration
	// BaseDelay is the ceiling of the first backoff, used when the server
	// sends no Retry-After; the n-th retry waits a random time from 0 to
	// min(MaxDelay, BaseDelay×2^(n-1)). Defaults to 200ms.
	BaseDelay time.Duration
	// MaxDelay is the largest ceiling of the backoff; it does not shorten
	// a Retry-After. Defaults to 5s; must not be below BaseDelay.
	MaxDelay time.Duration
}

// policy returns r with its defaults, or panics naming the field (prefix is
// where r sits in its caller's config).
func (r Retry) policy(prefix string) retry.Policy {
	p, err := retry.Policy(r).WithDefaults(prefix)
	if err != nil {
		panic("idemclient: " + err.Error())
	}
	return p
}

// Config tunes a Transport. A nil *Config is valid: every default.
type Config struct {
	// Retry bounds and paces the retries. Defaults to the zero Retry's
	// defaults.
	Retry Retry
	// MaxBody is the largest request body the Transport buffers to resend;
	// a larger one is refused with ErrBodyTooLarge, nothing sent. Defaults
	// to idem.DefaultMaxBody (1 MiB), what the middleware takes.
	MaxBody int64
}

// Errors returned before anything is sent. Compare with errors.Is; the
// returned error wraps one of them with the detail.
var (
	// ErrKeyInvalid: the request's Idempotency-Key header breaks the
	// server's rules (idem.ParseKey): repeated, empty, a list, over 255
	// characters, not printable ASCII.
	ErrKeyInvalid = errors.New("idemclient: Idempotency-Key invalid")
	// ErrBodyTooLarge: the request body is larger than Config.MaxBody.
	ErrBodyTooLarge = errors.New("idemclient: request body too large")
	// ErrBodyNotReplayable: the request body could not be read in full
	// (its reader failed, or it was not as long as its ContentLength), so
	// no attempt could resend it.
	ErrBodyNotReplayable = errors.New("idemclient: request body cannot be replayed")
)

// Error is RoundTrip's error for a guarded request that was sent at least
// once and got no final answer: the retries ended with a transport error or
// with the request's context. The outcome is unknown: the server may have
// run the request. To find out, send it again later with Key, which never
// runs it twice.
type Error struct {
	// Key is the Idempotency-Key every attempt carried.
	Key string
	// Attempts is how many attempts were sent.
	Attempts int
	// Err is why the retries ended: the last transport error, or the
	// context's error (context.DeadlineExceeded, context.Canceled).
	Err error
}

func (e *Error) Error() string {
	plural := "s"
	if e.Attempts == 1 {
		plural = ""
	}
	return fmt.Sprintf("idemclient: no final answer after %d attempt%s: %v", e.Attempts, plural, e.Err)
}

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// Result is what a Transport did for one response.
type Result struct {
	// Key is the Idempotency-Key every attempt carried; "" for a response
	// that did not come through a Transport's guarded path.
	Key string
	// Replayed is true when the answer is a replay of the stored one
	// (Idempotent-Replayed: true): the request ran earlier, once.
	Replayed bool
	// Attempts is how many attempts were sent; 0 for a response that did
	// not come through a Transport's guarded path.
	Attempts int
}

// ResultOf returns the Result of resp, a response of a Transport (directly,
// or through an http.Client). For any other response only Replayed is set,
// from its header. A nil resp gives the zero Result.
func ResultOf(resp *http.Response) Result {
	if resp == nil {
		return Result{}
	}
	r := Result{Replayed: resp.Header.Get(idem.HeaderReplayed) == "true"}
	if resp.Request != nil {
		if st, ok := resp.Request.Context().Value(stateKey{}).(*state); ok {
			r.Key, r.Attempts = st.key, st.attempts
		}
	}
	return r
}

// NewKey returns a new random key: a UUID version 4 from crypto/rand, the
// key a Transport draws for a request without one. Draw it when the intent
// is born (the buyer's click) and keep it with the intent, so that a retry
// after a restart sends the same key.
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Transport is an http.RoundTripper that sends guarded requests (see the
// package documentation) with one key and one body and retries them. It is
// safe for concurrent use; each request is retried on its own.
//
// WARNING: retrying is safe only against an endpoint that runs each key once,
// such as one behind idem's middleware. An endpoint that ignores the key may
// run a POST again after a dropped connection or a 5xx.
type Transport struct {
	base    http.RoundTripper
	policy  retry.Policy
	maxBody int64
	clock   retry.Clock
}

// New returns a Transport over base (http.DefaultTransport when nil), tuned
// by cfg (nil for every default). It panics when a field of cfg is negative
// or Retry.BaseDelay exceeds Retry.MaxDelay, naming the field.
func New(base http.RoundTripper, cfg *Config) *Transport {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.MaxBody < 0 {
		panic(fmt.Sprintf("idemclient: Config.MaxBody %d must not be negative", c.MaxBody))
	}
	if c.MaxBody == 0 {
		c.MaxBody = idem.DefaultMaxBody
	}
	if base == nil {
		base = http.DefaultTransport
	}
	return &Transport{base: base, policy: c.Retry.policy("Config.Retry"), maxBody: c.MaxBody, clock: retry.RealClock}
}

// CloseIdleConnections closes the idle connections of the base
// RoundTripper when it has such a method, as http.Client.CloseIdleConnections
// expects of its Transport.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// stateKey carries a request's *state in the context of each attempt, where
// ResultOf finds it through the response's Request.
type stateKey struct{}

type state struct {
	key      string
	attempts int
}

// RoundTrip sends req, and for a guarded request retries it as the package
// documentation says. It returns the final answer, or the last retryable
// one when Retry's bounds end the retries; an *Error when the request was
// sent and got no final answer; and an error wrapping ErrKeyInvalid,
// ErrBodyTooLarge or ErrBodyNotReplayable, with nothing sent, when it
// cannot be. The response's Request is the last attempt, whose context
// carries what ResultOf reads. req is not modified; its body is closed.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	values := req.Header.Values(idem.HeaderKey)
	if len(values) == 0 && req.Method != http.MethodPost && req.Method != http.MethodPatch {
		return t.base.RoundTrip(req)
	}
	key, drawn := "", len(values) == 0
	if drawn {
		key = NewKey()
	} else {
		k, err := idem.ParseKey(values)
		if err != nil {
			closeBody(req)
			reason := err.Error()
			if ke := (*idem.KeyError)(nil); errors.As(err, &ke) {
				reason = ke.Reason
			}
			return nil, fmt.Errorf("%w: %s", ErrKeyInvalid, reason)
		}
		key = k
	}
	body, err := t.readBody(req)
	if err != nil {
		return nil, err
	}

	ctx := req.Context()
	st := &state{key: key}
	actx := context.WithValue(ctx, stateKey{}, st)
	call := retry.Start(t.policy, t.clock)
	for {
		r := req.Clone(actx)
		if drawn {
			r.Header.Set(idem.HeaderKey, key)
		}
		setBody(r, body)
		st.attempts = call.Attempts()

		resp, err := t.base.RoundTrip(r)
		var hint time.Duration
		if err == nil {
			var again bool
			if again, hint = t.retryable(resp); !again {
				resp.Request = r
				return resp, nil
			}
		} else if cerr := retry.Ended(ctx); cerr != nil {
			if !errors.Is(err, cerr) {
				err = fmt.Errorf("%w: %w", cerr, err)
			}
			return nil, &Error{Key: key, Attempts: st.attempts, Err: err}
		}

		if _, werr := call.Wait(ctx, hint); werr != nil {
			switch {
			case errors.Is(werr, retry.ErrExhausted) && resp != nil:
				resp.Request = r
				return resp, nil
			case errors.Is(werr, retry.ErrExhausted):
				return nil, &Error{Key: key, Attempts: st.attempts, Err: err}
			case resp != nil:
				discard(resp)
				werr = fmt.Errorf("%w; the last answer was %d", werr, resp.StatusCode)
			default:
				werr = fmt.Errorf("%w; the last attempt failed: %w", werr, err)
			}
			return nil, &Error{Key: key, Attempts: st.attempts, Err: werr}
		}
		if resp != nil {
			discard(resp)
		}
	}
}

// readBody reads req's body once, up to the limit, and closes it; nil for a
// request without one.
func (t *Transport) readBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	defer req.Body.Close()
	if req.ContentLength > t.maxBody {
		return nil, fmt.Errorf("%w: %d bytes, over the limit of %d", ErrBodyTooLarge, req.ContentLength, t.maxBody)
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, t.maxBody+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: %w", ErrBodyNotReplayable, err)
	case int64(len(body)) > t.maxBody:
		return nil, fmt.Errorf("%w: over the limit of %d bytes", ErrBodyTooLarge, t.maxBody)
	case req.ContentLength > 0 && int64(len(body)) != req.ContentLength:
		return nil, fmt.Errorf("%w: ContentLength is %d, the body %d bytes", ErrBodyNotReplayable, req.ContentLength, len(body))
	}
	return body, nil
}

// setBody gives an attempt its own reader over the buffered body, and
// GetBody, so that the base transport may rewind it too.
func setBody(r *http.Request, body []byte) {
	r.ContentLength = int64(len(body))
	if body == nil {
		r.Body, r.GetBody = http.NoBody, nil
		return
	}
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	r.Body, _ = r.GetBody()
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// discard reads a little of an answer that is not returned, so that its
// connection can be reused, and closes it.
func discard(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
}

// maxProblem is the most of a 409's body read to find its problem type;
// idem's problems are a few hundred bytes.
const maxProblem = 16 << 10

// retryable reports whether resp may be retried with the same key, and the
// server's Retry-After (0 without one). It leaves resp's body readable.
func (t *Transport) retryable(resp *http.Response) (bool, time.Duration) {
	if resp.Header.Get(idem.HeaderReplayed) == "true" {
		return false, 0 // the stored answer, whatever its status
	}
	switch {
	case resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode >= 500:
	case resp.StatusCode == http.StatusConflict:
		switch problemSlug(resp) {
		case idem.ProblemInProgress, idem.ProblemPending:
		default:
			return false, 0
		}
	default:
		return false, 0
	}
	return true, retryAfter(resp.Header.Get("Retry-After"), t.clock.Now())
}

// problemSlug returns the slug of resp's problem type (what follows its
// last '#' or '/'), or "" when resp is not a problem. It puts back what it
// read of the body.
func problemSlug(resp *http.Response) string {
	mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if err != nil || mt != "application/problem+json" {
		return ""
	}
	head, err := io.ReadAll(io.LimitReader(resp.Body, maxProblem))
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	if err != nil {
		return ""
	}
	var p struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(head, &p) != nil {
		return ""
	}
	return p.Type[strings.LastIndexAny(p.Type, "#/")+1:]
}

// retryAfter parses a Retry-After value, delay-seconds or an HTTP date
// (RFC 9110, section 10.2.3), into a delay from now; 0 when v is absent,
// malformed or in the past.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		switch {
		case secs <= 0:
			return 0
		case secs > int64(24*time.Hour/time.Second):
			return 24 * time.Hour // past any MaxElapsed, without overflowing
		}
		return time.Duration(secs) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(0, at.Sub(now))
	}
	return 0
}
