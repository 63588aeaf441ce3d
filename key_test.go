package idem_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemguard/idem"
)

func TestParseKey(t *testing.T) {
	long := strings.Repeat("k", 255)
	for _, tc := range []struct {
		name   string
		values []string
		want   string
		err    error // ErrKeyMissing or ErrKeyInvalid; nil for success
	}{
		{"uuid bare", []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{"uuid quoted", []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{"surrounding spaces", []string{"  abc\t"}, "abc", nil},
		{"quoted with space inside", []string{`"a b"`}, "a b", nil},
		{"quoted escapes", []string{`"a\"b\\c"`}, `a"b\c`, nil},
		{"quoted comma", []string{`"a,b"`}, "a,b", nil},
		{"255 chars", []string{long}, long, nil},
		{"255 chars quoted", []string{`"` + long + `"`}, long, nil},
		{"one char", []string{"x"}, "x", nil},

		{"absent", nil, "", idem.ErrKeyMissing},
		{"repeated", []string{"a", "b"}, "", idem.ErrKeyInvalid},
		{"repeated same", []string{"a", "a"}, "", idem.ErrKeyInvalid},
		{"empty", []string{""}, "", idem.ErrKeyInvalid},
		{"only spaces", []string{"   "}, "", idem.ErrKeyInvalid},
		{"empty quoted", []string{`""`}, "", idem.ErrKeyInvalid},
		{"256 chars", []string{long + "k"}, "", idem.ErrKeyInvalid},
		{"256 chars quoted", []string{`"` + long + `k"`}, "", idem.ErrKeyInvalid},
		{"list", []string{"a, b"}, "", idem.ErrKeyInvalid},
		{"inner space bare", []string{"a b"}, "", idem.ErrKeyInvalid},
		{"control char", []string{"a\x01b"}, "", idem.ErrKeyInvalid},
		{"DEL", []string{"a\x7fb"}, "", idem.ErrKeyInvalid},
		{"non-ASCII", []string{"clé"}, "", idem.ErrKeyInvalid},
		{"non-ASCII quoted", []string{`"clé"`}, "", idem.ErrKeyInvalid},
		{"unterminated", []string{`"abc`}, "", idem.ErrKeyInvalid},
		{"stray quote", []string{`ab"c`}, "", idem.ErrKeyInvalid},
		{"params after quoted", []string{`"abc";x=1`}, "", idem.ErrKeyInvalid},
		{"two quoted", []string{`"a", "b"`}, "", idem.ErrKeyInvalid},
		{"bad escape", []string{`"a\nb"`}, "", idem.ErrKeyInvalid},
		{"trailing backslash", []string{`"a\`}, "", idem.ErrKeyInvalid},
		{"tab inside quoted", []string{"\"a\tb\""}, "", idem.ErrKeyInvalid},
		{"NUL", []string{"a\x00"}, "", idem.ErrKeyInvalid},
		{"invalid UTF-8", []string{"\xff"}, "", idem.ErrKeyInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := idem.ParseKey(tc.values)
			if tc.err == nil {
				require.NoError(t, err)
				require.Equal(t, tc.want, got)
				return
			}
			require.ErrorIs(t, err, tc.err)
			require.Empty(t, got)
			if tc.err == idem.ErrKeyInvalid {
				var ke *idem.KeyError
				require.ErrorAs(t, err, &ke)
				require.NotEmpty(t, ke.Reason)
			}
		})
	}
}
