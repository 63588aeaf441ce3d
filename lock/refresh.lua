-- KEYS[1]: the lease key. ARGV[1]: the owner token. ARGV[2]: the new TTL in ms.
-- Resets the TTL only when the key still holds the caller's token.
local v = redis.call("GET", KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
	return redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return 0
