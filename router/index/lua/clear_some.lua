-- ARGV: P, id, chunk size, upto ('' on the first call of a clear: requires a registered
-- instance and clears up to its current sequence number), ttl or ''.
-- Returns {blocks left, upto} or -1.
local inst = ARGV[2]
local limit = tonumber(ARGV[3])
local upto = ARGV[4]
local ttl = opt_number(ARGV[5])
local is_registered = registered(inst)
if upto == '' then
  if not is_registered then return -1 end
  upto = redis.call('HGET', P .. ':seq', inst) or '0'
end
local lru = lkey(inst)
local slot = slot_of(inst)
if slot then
  local victims = redis.call('ZRANGEBYSCORE', lru, '-inf', upto, 'LIMIT', 0, limit)
  for i = 1, #victims do unhold(victims[i], slot, ttl) end
  for i = 1, #victims, CHUNK do
    redis.call('ZREM', lru, unpack(victims, i, math.min(i + CHUNK - 1, #victims)))
  end
end
local left = redis.call('ZCOUNT', lru, '-inf', upto)
if left == 0 and slot and not is_registered and redis.call('ZCARD', lru) == 0 then
  -- An unregistered instance is gone for good: recycle its slot.
  redis.call('HDEL', P .. ':seq', inst)
  redis.call('HDEL', P .. ':slot', inst)
  redis.call('RPUSH', P .. ':free_slots', slot)
  rebuild_names()
end
return {left, upto}
