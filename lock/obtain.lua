-- KEYS[1]: the lease key. ARGV[1]: the value (owner token, then state).
-- ARGV[2]: the TTL in ms.
-- Takes the lease when the key is free, as SET NX PX would, and returns 1;
-- otherwise returns the value the key holds and its remaining TTL in ms, so
-- that the caller learns the key's state, and how old it is, in the same
-- round trip. (1, not nil: go-redis turns a nil reply into an error and then
-- runs its retry classification on it, a dozen allocations per lease.)
local held = redis.call("GET", KEYS[1])
if held then
	return {held, redis.call("PTTL", KEYS[1])}
end
redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
return 1
