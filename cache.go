package idem

import (
	"container/list"
	"sync"
	"time"
)

// answerCache is a bounded LRU of finished answers, so that a retry storm on
// a hot key is answered without a round trip. It never holds in-progress
// state: only answers already stored durably enter it, and each entry expires
// before its key does in the store.
type answerCache struct {
	mu    sync.Mutex
	size  int
	ttl   time.Duration
	ll    *list.List // front = most recently used
	items map[string]*list.Element
	now   func() time.Time
}

type cacheEntry struct {
	id      string
	fp      Fingerprint
	resp    Response
	expires time.Time
}

func newAnswerCache(size int, ttl time.Duration) *answerCache {
	return &answerCache{size: size, ttl: ttl, ll: list.New(), items: make(map[string]*list.Element, size), now: time.Now}
}

// cacheID joins scope and key unambiguously: neither may contain NUL.
func cacheID(req Request) string { return req.Scope + "\x00" + req.Key }

// get returns the cached answer of req's key, if any and not expired.
func (c *answerCache) get(req Request) (cacheEntry, bool) {
	id := cacheID(req)
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[id]
	if !ok {
		return cacheEntry{}, false
	}
	e := el.Value.(*cacheEntry)
	if !c.now().Before(e.expires) {
		c.ll.Remove(el)
		delete(c.items, id)
		return cacheEntry{}, false
	}
	c.ll.MoveToFront(el)
	return *e, true
}

// put caches a finished answer until the earlier of now+ttl and expiresBy
// (when the key expires in the store, counted on the monotonic clock from
// the row's TTL).
func (c *answerCache) put(req Request, resp Response, expiresBy time.Time) {
	now := c.now()
	expires := now.Add(c.ttl)
	if !expiresBy.IsZero() && expiresBy.Before(expires) {
		expires = expiresBy
	}
	if !now.Before(expires) {
		return
	}
	id := cacheID(req)
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[id]; ok {
		e := el.Value.(*cacheEntry)
		e.fp, e.resp, e.expires = req.Fingerprint, resp, expires
		c.ll.MoveToFront(el)
		return
	}
	c.items[id] = c.ll.PushFront(&cacheEntry{id: id, fp: req.Fingerprint, resp: resp, expires: expires})
	for c.ll.Len() > c.size {
		last := c.ll.Back()
		c.ll.Remove(last)
		delete(c.items, last.Value.(*cacheEntry).id)
	}
}

// len returns the number of entries, expired or not.
func (c *answerCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ll.Len()
}

// cloneResponse copies the header map and body, so that a caller mutating
// one replayed answer cannot change what the next retry gets.
func cloneResponse(r Response) Response {
	out := Response{Status: r.Status, Header: r.Header.Clone()}
	if r.Body != nil {
		out.Body = append([]byte(nil), r.Body...)
	}
	return out
}
