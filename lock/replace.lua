-- KEYS[1]: the lease key. ARGV[1]: the owner token. ARGV[2]: the new value
-- (the same token, then the new state), or "" to delete. ARGV[3]: the new TTL
-- in ms, or 0 to keep the remaining one.
-- Acts only when the key still holds the caller's token: returns 1, else 0.
local v = redis.call("GET", KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
	if ARGV[2] == "" then
		return redis.call("DEL", KEYS[1])
	end
	if ARGV[3] == "0" then
		redis.call("SET", KEYS[1], ARGV[2], "KEEPTTL")
	else
		redis.call("SET", KEYS[1], ARGV[2], "PX", ARGV[3])
	end
	return 1
end
return 0
