-- KEYS[1]: the lock key. ARGV[1]: the owner token.
-- Deletes the key only when it still holds the caller's token.
if redis.call("GET", KEYS[1]) == ARGV[1] then
	return redis.call("DEL", KEYS[1])
end
return 0
