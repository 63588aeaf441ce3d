-- KEYS[1]: the lease key. ARGV[1]: the owner token. ARGV[2]: the new TTL in ms.
-- Resets the TTL only when the key still holds the caller's token, and
-- records it in the value ("|<ttl in ms>|" after the token) as the TTL the
-- key was last given. Returns 1, else 0.
local v = redis.call("GET", KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
	local rest = string.sub(v, #ARGV[1] + 1)
	local ttl = string.match(rest, "^|(%d+)|")
	if ttl then
		rest = string.sub(rest, #ttl + 3)
	end
	redis.call("SET", KEYS[1], ARGV[1] .. "|" .. ARGV[2] .. "|" .. rest, "PX", ARGV[2])
	return 1
end
return 0
