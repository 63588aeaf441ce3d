package idem

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"
)

// errNotStorable marks an answer that was delivered but cannot be stored: it
// was flushed, hijacked or larger than the capture limit.
var errNotStorable = errors.New("idem: answer streamed, hijacked or too large to store")

// recorder captures the handler's answer without sending it: the middleware
// stores it first, then sends it (send), so that a client reads only an
// answer every replay gets, and a slow reader cannot hold the key while its
// answer waits to be stored. An answer the handler streams (Flush), hijacks or
// makes larger than the capture limit is sent as it comes instead (passing),
// and is not stored.
type recorder struct {
	w        http.ResponseWriter
	allow    []string
	max      int64
	status   int
	header   http.Header // the allowlisted headers, as stored
	body     bytes.Buffer
	passing  bool // the answer goes straight to the client: not stored
	overflow bool
	streamed bool
}

func (rc *recorder) Header() http.Header { return rc.w.Header() }

func (rc *recorder) WriteHeader(code int) {
	if rc.status != 0 {
		return // superfluous: net/http would only log it
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		rc.w.WriteHeader(code) // informational (103 Early Hints): not the answer
		return
	}
	rc.status = code
	rc.header = captureHeaders(rc.w.Header(), rc.allow)
}

func (rc *recorder) Write(p []byte) (int, error) {
	if rc.status == 0 {
		h := rc.w.Header()
		if _, set := h["Content-Type"]; !set && len(p) > 0 {
			// net/http would sniff the type; do it here so that the stored
			// answer carries exactly what the client gets.
			h.Set("Content-Type", http.DetectContentType(p))
		}
		rc.WriteHeader(http.StatusOK)
	}
	if rc.passing {
		return rc.w.Write(p)
	}
	if int64(rc.body.Len()+len(p)) > rc.max {
		rc.overflow = true
		rc.pass()
		return rc.w.Write(p)
	}
	return rc.body.Write(p)
}

// pass sends what was captured so far and lets the rest of the answer go
// straight to the client.
func (rc *recorder) pass() {
	if rc.passing {
		return
	}
	rc.passing = true
	rc.w.WriteHeader(rc.status)
	_, _ = rc.w.Write(rc.body.Bytes())
	rc.body = bytes.Buffer{}
}

// Flush delivers what was written so far; the answer is then streamed and is
// not stored.
func (rc *recorder) Flush() {
	if rc.status == 0 {
		rc.WriteHeader(http.StatusOK)
	}
	rc.streamed = true
	rc.pass()
	_ = http.NewResponseController(rc.w).Flush()
}

// Hijack hands the connection to the handler; the answer is not stored.
func (rc *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	rc.streamed, rc.passing = true, true
	return http.NewResponseController(rc.w).Hijack()
}

// Unwrap lets http.ResponseController reach the underlying writer for the
// features the recorder does not intercept (deadlines, full duplex).
func (rc *recorder) Unwrap() http.ResponseWriter { return rc.w }

// result is the captured answer; errNotStorable when it must not be stored.
func (rc *recorder) result() (Response, error) {
	if rc.status == 0 {
		// The handler wrote nothing: net/http answers 200 with no body.
		rc.status = http.StatusOK
		rc.header = captureHeaders(rc.w.Header(), rc.allow)
	}
	resp := Response{Status: rc.status, Header: rc.header, Body: rc.body.Bytes()}
	if rc.streamed || rc.overflow {
		return resp, errNotStorable
	}
	return resp, nil
}

// captured is the answer as captured, once result has run.
func (rc *recorder) captured() Response {
	return Response{Status: rc.status, Header: rc.header, Body: rc.body.Bytes()}
}

// send delivers the answer once the guard has decided what happens to it:
// the handler's headers, then, when the key holds another answer than the one
// captured (a handler that completed one answer through idem.Complete and
// wrote another), the stored one, so that the client reads what every replay
// gets.
func (rc *recorder) send(stored Response) {
	if rc.passing {
		return
	}
	status, body := rc.status, rc.body.Bytes()
	dropUnstorable(rc.w.Header(), rc.allow) // the client gets the headers replays get
	if stored.Status != 0 {
		h := rc.w.Header()
		for k, v := range stored.Header {
			h[k] = v
		}
		status, body = stored.Status, stored.Body
	}
	if bodyAllowed(status) {
		rc.w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	}
	rc.w.WriteHeader(status)
	if bodyAllowed(status) {
		_, _ = rc.w.Write(body)
	}
}

// storable reports whether a header value can be stored and replayed byte
// for byte: no CR, LF or NUL inside (a client could not have received it as
// sent), and valid UTF-8 (the store's JSON would turn obs-text such as a
// Latin-1 ETag into U+FFFD).
func storable(v string) bool {
	return !strings.ContainsAny(v, "\r\n\x00") && utf8.ValidString(v)
}

// dropUnstorable removes from h the values of allowlisted headers that
// captureHeaders does not store, before the answer is sent: the client gets
// the headers every replay gets, not a value no replay can give back.
func dropUnstorable(h http.Header, allow []string) {
	for _, k := range allow {
		vs, ok := h[k]
		if !ok {
			continue
		}
		kept := vs[:0:0]
		for _, v := range vs {
			if storable(v) {
				kept = append(kept, v)
			}
		}
		switch {
		case len(kept) == len(vs):
		case len(kept) == 0:
			delete(h, k)
		default:
			h[k] = kept
		}
	}
}

// captureHeaders copies the allowlisted headers, dropping the values that
// are not storable: a header is replayed as sent or not at all, and
// dropUnstorable keeps such values from the first client too.
func captureHeaders(h http.Header, allow []string) http.Header {
	out := make(http.Header, len(allow))
	n := 0
	for _, k := range allow {
		n += len(h[k])
	}
	all := make([]string, 0, n)
	for _, k := range allow {
		vs, ok := h[k]
		if !ok {
			continue
		}
		kept := all[len(all) : len(all) : len(all)+len(vs)]
		for _, v := range vs {
			if storable(v) {
				kept = append(kept, v)
			}
		}
		if len(kept) > 0 {
			out[k] = kept
			all = all[:len(all)+len(kept)]
		}
	}
	return out
}
