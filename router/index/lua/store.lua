-- ARGV: P, id, now, ttl or '', default capacity or '', chain as hex.  Returns 0 or -1.
local inst = ARGV[2]
if not registered(inst) then return -1 end
local slot = slot_of(inst)
local now_s = ARGV[3]
local ttl = opt_number(ARGV[4])
local hex = ARGV[6]
local n = #hex / 16
if n > 0 then
  local base = redis.call('HINCRBY', P .. ':seq', inst, n) - n
  local lru = lkey(inst)
  local args, k = {}, 0
  -- Last block first, with increasing sequence numbers: parents end up more recent.
  for i = n - 1, 0, -1 do
    local block = hex_at(hex, i)
    redis.call('SETBIT', bkey(block), slot, 1)
    if ttl then redis.call('HSET', tkey(block), slot, now_s) end
    args[k + 1], args[k + 2], k = string.format('%d', base + n - i), block, k + 2
    if k >= 2 * CHUNK then
      redis.call('ZADD', lru, unpack(args, 1, k))
      k = 0
    end
  end
  if k > 0 then redis.call('ZADD', lru, unpack(args, 1, k)) end
end
expire(inst, slot, tonumber(now_s), ttl)
evict(inst, slot, opt_number(ARGV[5]), ttl)
return 0
