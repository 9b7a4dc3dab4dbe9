-- ARGV: P, id, now, ttl or ''.  Returns the number of blocks held, or -1.
local inst = ARGV[2]
if not registered(inst) then return -1 end
expire(inst, slot_of(inst), tonumber(ARGV[3]), opt_number(ARGV[4]))
return redis.call('ZCARD', lkey(inst))
