-- KEYS[1]: the lease key. ARGV[1]: the owner token. ARGV[2]: the new state.
-- ARGV[3]: the new TTL in ms, or 0 to keep the remaining one. ARGV[4]: "1" to
-- delete the lease instead.
-- Acts only when the key still holds the caller's token: returns 1, else 0.
-- The value written is the token, then "|<ttl in ms>|", the TTL the key was
-- last given (kept with KEEPTTL; a value of an older version has none, and
-- keeps none), then the state.
local v = redis.call("GET", KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
	if ARGV[4] == "1" then
		return redis.call("DEL", KEYS[1])
	end
	if ARGV[3] == "0" then
		local ttl = string.match(v, "^|(%d+)|", #ARGV[1] + 1)
		local basis = ""
		if ttl then
			basis = "|" .. ttl .. "|"
		end
		redis.call("SET", KEYS[1], ARGV[1] .. basis .. ARGV[2], "KEEPTTL")
	else
		redis.call("SET", KEYS[1], ARGV[1] .. "|" .. ARGV[3] .. "|" .. ARGV[2], "PX", ARGV[3])
	end
	return 1
end
return 0
