-- KEYS[1]: the lease key. ARGV[1]: the owner token.
-- Returns the remaining TTL in ms when the caller holds the key, else -3.
local v = redis.call("GET", KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
	return redis.call("PTTL", KEYS[1])
end
return -3
