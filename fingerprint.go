package idem

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"io"
)

// Fingerprint is the SHA-256 digest that tells a retry (same key, same
// fingerprint) from a client bug (same key, different fingerprint).
type Fingerprint [32]byte

// fingerprintDomain separates idem's digests from any other SHA-256 use and
// versions the encoding.
const fingerprintDomain = "idem/fingerprint/v1"

// HashParts returns the fingerprint of an ordered list of byte strings. The
// encoding is the domain tag, the number of parts, then each part preceded by
// its length as a 64-bit big-endian integer, so no two different lists share
// an encoding: ("ab","c") and ("a","bc") differ, and so do ("a") and ("a","").
//
// Transports other than HTTP use it directly, e.g. a gRPC interceptor with the
// full method name and the marshalled message.
func HashParts(parts ...[]byte) Fingerprint {
	h := sha256.New()
	io.WriteString(h, fingerprintDomain)
	writeLen(h, len(parts))
	for _, p := range parts {
		writeLen(h, len(p))
		h.Write(p)
	}
	var fp Fingerprint
	h.Sum(fp[:0])
	return fp
}

// HashRequest returns the fingerprint of an HTTP request: its method, its
// target (the escaped path with the raw query, as in the request line) and
// the exact body bytes the client sent. It is HashParts(method, target, body).
func HashRequest(method, target string, body []byte) Fingerprint {
	return HashParts([]byte(method), []byte(target), body)
}

func writeLen(h hash.Hash, n int) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(n))
	h.Write(b[:])
}
