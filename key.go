package idem

import (
	"strings"
)

// KeyError says why an Idempotency-Key header was refused. Its Reason is safe
// to show to the client.
type KeyError struct {
	Reason string
}

func (e *KeyError) Error() string { return "idem: Idempotency-Key header invalid: " + e.Reason }

// Is makes errors.Is(err, ErrKeyInvalid) true.
func (e *KeyError) Is(target error) bool { return target == ErrKeyInvalid }

// ParseKey returns the idempotency key carried by the values of the
// Idempotency-Key header fields of one request (http.Header.Values).
//
// It accepts exactly one field, holding either an RFC 8941 sf-string
// ("\"8e03...\"", with \" and \\ escapes) or, for clients that send it bare, a
// token of visible ASCII without '"' or ','. The key is 1 to 255 characters of
// printable ASCII (a quoted key may contain spaces). Surrounding spaces and
// tabs are ignored. Two fields, a list ("a, b") or parameters after a quoted
// string are refused: a key must be unambiguous.
func ParseKey(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", ErrKeyMissing
	case 1:
	default:
		return "", &KeyError{Reason: "repeated header field"}
	}
	v := strings.Trim(values[0], " \t")
	if v == "" {
		return "", &KeyError{Reason: "empty"}
	}
	var key string
	if v[0] == '"' {
		k, err := parseSFString(v)
		if err != nil {
			return "", err
		}
		key = k
	} else {
		for i := 0; i < len(v); i++ {
			c := v[i]
			switch {
			case c == ',':
				return "", &KeyError{Reason: "a list of keys; send exactly one"}
			case c == '"':
				return "", &KeyError{Reason: "stray quote; quote the whole key or none of it"}
			case c < 0x21 || c > 0x7e:
				return "", &KeyError{Reason: "not printable ASCII"}
			}
		}
		key = v
	}
	if len(key) == 0 {
		return "", &KeyError{Reason: "empty"}
	}
	if len(key) > MaxKeyLen {
		return "", &KeyError{Reason: "longer than 255 characters"}
	}
	return key, nil
}

// parseSFString parses an RFC 8941 sf-string that must span all of v.
func parseSFString(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", &KeyError{Reason: `bad escape in quoted key (only \" and \\ are allowed)`}
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", &KeyError{Reason: "characters after the quoted key"}
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", &KeyError{Reason: "not printable ASCII"}
		default:
			b.WriteByte(c)
		}
		if b.Len() > MaxKeyLen {
			return "", &KeyError{Reason: "longer than 255 characters"}
		}
	}
	return "", &KeyError{Reason: "unterminated quoted key"}
}
