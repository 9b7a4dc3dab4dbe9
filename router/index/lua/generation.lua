-- ARGV: P, a fresh token.  Returns the token naming the index's contents, setting it to the
-- fresh one when absent (a new or emptied Redis).
local key = P .. ':generation'
local current = redis.call('GET', key)
if current then return current end
redis.call('SET', key, ARGV[2])
return ARGV[2]
