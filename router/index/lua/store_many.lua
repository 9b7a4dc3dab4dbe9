-- ARGV: P, now, ttl or '', default capacity or '', then pairs (instance id, its blocks
-- as hex in the order a store touches them: each chain last block first, the chains in
-- order).  Touches each instance's blocks with increasing sequence numbers (parents end
-- up more recent than their children), then purges the expired and evicts past
-- capacity: the same as storing the chains one by one. Returns the ids of the
-- unregistered instances among the pairs (their blocks are skipped).
local now_s = ARGV[2]
local now = tonumber(now_s)
local ttl = opt_number(ARGV[3])
local default_cap = opt_number(ARGV[4])
local sub, format, call = string.sub, string.format, redis.call
local BP, TP = P .. ':b:', P .. ':t:'
local unknown = {}
for g = 5, #ARGV, 2 do
  local inst, hex = ARGV[g], ARGV[g + 1]
  if not registered(inst) then
    unknown[#unknown + 1] = inst
  else
    local slot = slot_of(inst)
    local n = #hex / 16
    if n > 0 then
      local base = call('HINCRBY', P .. ':seq', inst, n) - n
      local lru = lkey(inst)
      local args, k = {}, 0
      for i = 0, n - 1 do
        local block = sub(hex, i * 16 + 1, i * 16 + 16)
        call('SETBIT', BP .. block, slot, '1')  -- a string: a number costs a %.17g each
        if ttl then call('HSET', TP .. block, slot, now_s) end
        args[k + 1], args[k + 2], k = format('%d', base + i + 1), block, k + 2
        if k >= 2 * CHUNK then
          call('ZADD', lru, unpack(args, 1, k))
          k = 0
        end
      end
      if k > 0 then call('ZADD', lru, unpack(args, 1, k)) end
    end
    expire(inst, slot, now, ttl)
    evict(inst, slot, default_cap, ttl)
  end
end
return unknown
