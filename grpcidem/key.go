package grpcidem

import (
	"strings"

	"github.com/idemguard/idem"
)

// MetadataKey is the request metadata entry that carries the idempotency key.
const MetadataKey = "idempotency-key"

// MetadataReplayed is the response header metadata entry set to "true" on
// every replayed answer.
const MetadataReplayed = "idempotent-replayed"

// parseKey returns the idempotency key carried by the values of one metadata
// entry. It accepts exactly one value of 1 to 255 characters of printable
// ASCII (0x20-0x7E, which is also what gRPC allows in a text metadata value),
// taken literally: there is no quoting syntax. It refuses a value that starts
// or ends with a space (HTTP/2 forbids it and proxies trim it, so the key
// would change on the way) and one holding a comma (proxies join repeated
// entries with commas, so "a,b" may be two keys). Its errors are ParseKey's:
// idem.ErrKeyMissing, or an *idem.KeyError whose Reason the client may read,
// so that idem.Classify refuses them.
func parseKey(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", idem.ErrKeyMissing
	case 1:
	default:
		return "", &idem.KeyError{Reason: "repeated metadata entry"}
	}
	v := values[0]
	switch {
	case v == "":
		return "", &idem.KeyError{Reason: "empty"}
	case len(v) > idem.MaxKeyLen:
		return "", &idem.KeyError{Reason: "longer than 255 characters"}
	case v[0] == ' ' || v[len(v)-1] == ' ':
		return "", &idem.KeyError{Reason: "leading or trailing space"}
	case strings.IndexByte(v, ',') >= 0:
		return "", &idem.KeyError{Reason: "a list of keys; send exactly one"}
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c > 0x7e {
			return "", &idem.KeyError{Reason: "not printable ASCII"}
		}
	}
	return v, nil
}
