package idem

import (
	"encoding/binary"
	"net/http"
	"time"
)

// The hybrid's lease holds what Redis knows about a key, so that the requests
// that must not run are answered without PostgreSQL. Its state is one byte
// saying what is known, the fingerprint it is known for, and, for an answer,
// a copy of it:
//
//	leaseClaiming  a request took the lease and is claiming the row: fp is
//	               its own, not yet checked against any row
//	leaseRunning   the row is in progress under fp (read from the row)
//	leasePending   the row is in progress under fp, past its holder's
//	               MaxHold: it waits for reconciliation
//	leaseAnswer    the row's committed answer under fp, copied whole ('a',
//	               a copy with JSON headers, is not read: such a copy
//	               sends its replays to the row)
//	leaseDone      the row's answer under fp is too large to copy: read it
//
// Nothing read from a lease ever starts the work: a request that gets the
// lease still claims the row. A lease may only refuse (409, 422) or replay an
// answer PostgreSQL committed. Every state but leaseClaiming was read from
// the row, so it is answered as the row would be; leaseClaiming is answered
// 409 for its own fingerprint (that request is running, or about to lose its
// claim and replace the lease with what the row says) and from the row
// otherwise.
const (
	leaseClaiming byte = 'c'
	leaseRunning  byte = 'r'
	leasePending  byte = 'p'
	leaseAnswer   byte = 'A'
	leaseDone     byte = 'd'
)

// Limits of the answer copy. An answer larger than maxLeaseAnswer (encoded
// headers plus body) is kept as leaseDone, and its replays read the row; a
// copy lives at most leaseAnswerTTL, and never longer than its key's
// remaining retention.
const (
	maxLeaseAnswer = 16 << 10
	leaseAnswerTTL = 10 * time.Minute
)

// leaseState is a decoded lease.
type leaseState struct {
	kind byte
	fp   Fingerprint
	resp Response // leaseAnswer only
}

// encodeLease returns the state of kind for fp, with no answer.
func encodeLease(kind byte, fp Fingerprint) []byte {
	b := make([]byte, 0, 1+len(fp))
	b = append(b, kind)
	return append(b, fp[:]...)
}

// encodeAnswerLease returns the copy of an answer stored under fp, or the
// leaseDone marker when it is larger than maxLeaseAnswer: the kind, fp, the
// status, the length of the encoded headers (see appendHeader), the headers,
// then the body.
func encodeAnswerLease(fp Fingerprint, a Response) []byte {
	headers := appendHeader(nil, a.Header)
	if len(headers)+len(a.Body) > maxLeaseAnswer {
		return encodeLease(leaseDone, fp)
	}
	b := make([]byte, 0, 1+len(fp)+2+binary.MaxVarintLen64+len(headers)+len(a.Body))
	b = append(b, leaseAnswer)
	b = append(b, fp[:]...)
	b = binary.BigEndian.AppendUint16(b, uint16(a.Status))
	b = binary.AppendUvarint(b, uint64(len(headers)))
	b = append(b, headers...)
	return append(b, a.Body...)
}

// decodeLease reads a lease's state. It reports false for anything it does
// not know, such as the bare token of an older version's lease or a state
// of a newer version: the caller then reads the row. A decoded answer is
// the value durable reads back from the row: a non-nil Header and Body.
func decodeLease(b []byte) (leaseState, bool) {
	var st leaseState
	if len(b) < 1+len(st.fp) {
		return st, false
	}
	st.kind = b[0]
	copy(st.fp[:], b[1:])
	rest := b[1+len(st.fp):]
	switch st.kind {
	case leaseClaiming, leaseRunning, leasePending, leaseDone:
		return st, len(rest) == 0
	case leaseAnswer:
	default:
		return st, false
	}
	if len(rest) < 2 {
		return st, false
	}
	st.resp.Status = int(binary.BigEndian.Uint16(rest))
	n, w := binary.Uvarint(rest[2:])
	rest = rest[2+max(w, 0):]
	if w <= 0 || n > uint64(len(rest)) || st.resp.Status < 100 || st.resp.Status > 599 {
		return st, false
	}
	h, ok := readHeader(rest[:n])
	if !ok {
		return st, false
	}
	st.resp.Header = h
	st.resp.Body = append([]byte{}, rest[n:]...)
	return st, true
}

// appendHeader appends h to b: the number of names, then per name its
// length and bytes and its number of values plus one (0 for a nil list),
// then per value its length and bytes; every number a uvarint. It keeps what
// durable's JSON keeps of a header whose names and values are UTF-8 (the
// only ones it stores): every name, every value in order, and a nil list
// apart from an empty one.
func appendHeader(b []byte, h http.Header) []byte {
	b = binary.AppendUvarint(b, uint64(len(h)))
	for name, values := range h {
		b = appendString(b, name)
		if values == nil {
			b = append(b, 0)
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(values))+1)
		for _, v := range values {
			b = appendString(b, v)
		}
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// readHeader reads what appendHeader wrote, and nothing else: every byte of
// b, no name twice.
func readHeader(b []byte) (http.Header, bool) {
	r := reader{b: b, ok: true}
	names := r.uvarint()
	if names > uint64(len(b))/2 { // each name takes at least two bytes: its length and its count
		return nil, false
	}
	h := make(http.Header, names)
	for range names {
		name, ok := r.string()
		if _, dup := h[name]; !ok || dup {
			return nil, false
		}
		n := r.uvarint()
		if n > uint64(len(r.b))+1 {
			return nil, false
		}
		var values []string
		if n > 0 {
			values = make([]string, 0, n-1)
		}
		for range int(max(n, 1) - 1) {
			v, ok := r.string()
			if !ok {
				return nil, false
			}
			values = append(values, v)
		}
		h[name] = values
	}
	return h, r.ok && len(r.b) == 0
}

// reader consumes uvarints and length-prefixed strings; ok turns false for
// good at the first malformed one.
type reader struct {
	b  []byte
	ok bool
}

func (r *reader) uvarint() uint64 {
	v, w := binary.Uvarint(r.b)
	if w <= 0 {
		r.ok, r.b = false, nil
		return 0
	}
	r.b = r.b[w:]
	return v
}

func (r *reader) string() (string, bool) {
	n := r.uvarint()
	if !r.ok || n > uint64(len(r.b)) {
		r.ok, r.b = false, nil
		return "", false
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s, true
}
