package idem

import (
	"encoding/binary"
	"encoding/json"
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
//	leaseAnswer    the row's committed answer under fp, copied whole
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
	leaseAnswer   byte = 'a'
	leaseDone     byte = 'd'
)

// Limits of the answer copy. An answer larger than maxLeaseAnswer (headers as
// stored plus body) is kept as leaseDone, and its replays read the row; a
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
// leaseDone marker when it is larger than maxLeaseAnswer. The headers are
// encoded as the store encodes them (JSON), so that a replay from the copy is
// the same value as a replay from the row.
func encodeAnswerLease(fp Fingerprint, a Response) []byte {
	h := a.Header
	if h == nil {
		h = http.Header{}
	}
	headers, err := json.Marshal(h)
	if err != nil || len(headers)+len(a.Body) > maxLeaseAnswer {
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
// of a newer version: the caller then reads the row.
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
	// As durable's scanRecord reads a row: a JSON null is an empty header,
	// an empty body is non-nil.
	st.resp.Header = http.Header{}
	if err := json.Unmarshal(rest[:n], &st.resp.Header); err != nil {
		return st, false
	}
	if st.resp.Header == nil {
		st.resp.Header = http.Header{}
	}
	st.resp.Body = append([]byte{}, rest[n:]...)
	return st, true
}
