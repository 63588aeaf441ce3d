package idem

import (
	"encoding/base32"
	"fmt"
	"strings"
)

// DeriveID returns an identifier derived from an intent and a purpose
// ("order", "payment", ...): prefix followed by 26 lowercase base32
// characters (130 bits of SHA-256 over the length-prefixed parts).
//
// Every execution of the same intent derives the same ID: the work (with
// ExecutionFromContext) and a reconciler (with reconcile.Item.Intent), also after
// a crash and a restart. Different intents or purposes never share one; a key
// reused after it expired is a new intent, so it derives a new ID; a key
// released because nothing happened keeps its intent, so the next attempt
// derives the same ID. Give the resources the work creates such IDs (an
// order's public id, say) and make them unique in your own tables, and
// DownstreamKey gives the provider the same key for the same intent.
func DeriveID(prefix, purpose string, intent Token) string {
	fp := HashParts([]byte("idem/derive/v2"), []byte(purpose), intent[:])
	enc := base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(fp[:17])
	return prefix + strings.ToLower(enc[:26])
}

// DownstreamKey returns the idempotency key a service sends to a provider it
// calls on behalf of a resource: kind + "-" + id, e.g. "order-ord_4f2k...".
// It is stable across every retry and restart as long as id is (use an ID
// stored with the resource, or DeriveID). The result is 1 to 255 characters of
// printable ASCII without spaces or quotes, so every provider accepts it; an
// error says which part is unusable.
//
// The key must be born with the intent, not with the request object: a client
// that creates a new key inside its retry loop turns every retry into a new
// charge. See "Downstream keys" in docs/operating.md.
func DownstreamKey(kind, id string) (string, error) {
	if kind == "" || id == "" {
		return "", fmt.Errorf("idem: downstream key: empty kind or id")
	}
	k := kind + "-" + id
	if len(k) > MaxKeyLen {
		return "", fmt.Errorf("idem: downstream key: %d characters, more than %d", len(k), MaxKeyLen)
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= 0x20 || c >= 0x7f || c == '"' || c == ',' {
			return "", fmt.Errorf("idem: downstream key: character %q at %d is not allowed", c, i)
		}
	}
	return k, nil
}
